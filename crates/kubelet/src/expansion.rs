//! The kubelet's `$(VAR)` expansion of a container's command, args and env values
//! (upstream's third_party/forked/golang/expansion): `$(NAME)` is the variable's value,
//! `$$` a literal `$`, and a reference to an unknown variable stays as written.

/// The kubelet's `$(VAR)` expansion of command and args against the container's
/// environment: `$$` is a literal `$`, unknown references stay as written.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    expand_with(s, |name| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

/// The `$(VAR)` expansion with `lookup` giving each reference's value; a reference it has
/// none for stays as written.
pub fn expand_with(s: &str, mut lookup: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_expansion() {
        let env = vec![("A".to_owned(), "x".to_owned())];
        assert_eq!(expand("$(A)-$$(A)-$(B)-$", &env), "x-$(A)-$(B)-$");
    }
}
