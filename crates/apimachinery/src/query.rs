//! URL query strings as Go's `net/url` reads them for the API server and the kubelet: pairs
//! split on `&` and the first `=`, `+` a space, `%XX` a byte (a malformed escape is kept
//! as it is), invalid UTF-8 replaced.

/// One query component, unescaped.
pub fn unescape(s: &str) -> String {
    decode(s, true)
}

/// One path segment, unescaped (`+` stays a plus, as Go's PathUnescape).
pub fn unescape_path(s: &str) -> String {
    decode(s, false)
}

fn decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' => match b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(v) => {
                    out.push(v);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query's parameters in order, repeated ones kept (a key without `=` has the value
/// "").
pub fn pairs(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (unescape(k), unescape(v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_like_net_url() {
        assert_eq!(
            pairs(Some(
                "labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&x&&follow="
            )),
            vec![
                ("labelSelector".to_owned(), "app=web,tier in (a)".to_owned()),
                ("watch".to_owned(), "1".to_owned()),
                ("x".to_owned(), String::new()),
                ("follow".to_owned(), String::new()),
            ]
        );
        assert_eq!(unescape("100%"), "100%");
        assert_eq!(unescape("%"), "%");
        assert_eq!(unescape("%4"), "%4");
        assert_eq!(unescape("%zz%4"), "%zz%4");
        assert_eq!(unescape("%E2%9C%93"), "\u{2713}");
        assert!(pairs(None).is_empty());
        assert_eq!(unescape_path("a+b%2Fc"), "a+b/c");
    }
}
