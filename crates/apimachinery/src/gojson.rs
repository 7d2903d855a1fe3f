//! The syntax errors of Go's `encoding/json`, word for word: kube-apiserver checks a body
//! with Go's scanner before decoding it, and clients see its message
//! (`invalid character '}' looking for beginning of object key string`,
//! `unexpected end of JSON input`). This is a validating scanner with the same states, so
//! the first error found and its wording are Go's.

/// Go's message for the first syntax error in `data`, or None if `data` is one valid JSON
/// value (surrounded by whitespace).
pub fn syntax_error(data: &[u8]) -> Option<String> {
    let mut s = Scanner {
        data,
        pos: 0,
        stack: Vec::new(),
    };
    s.document().err()
}

/// What the innermost open container expects next.
#[derive(Clone, Copy, PartialEq)]
enum Frame {
    /// In an object, at or after a value (then expecting ',' or '}').
    ObjectValue,
    /// In an array, after an element (expecting ',' or ']').
    Array,
}

struct Scanner<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Frame>,
}

const EOF: &str = "unexpected end of JSON input";

/// Go's scanner refuses containers nested deeper than this.
const MAX_NESTING_DEPTH: usize = 10_000;

/// Go's quoteChar: the byte as a rune in single quotes, escaped as strconv.Quote does.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => "'\\''".to_owned(),
        b'"' => "'\"'".to_owned(),
        _ => {
            let q = crate::validation::go_quote(&char::from(c).to_string());
            format!("'{}'", &q[1..q.len() - 1])
        }
    }
}

fn invalid(c: u8, context: &str) -> String {
    format!("invalid character {} {context}", quote_char(c))
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

impl Scanner<'_> {
    fn next(&mut self) -> Result<u8, String> {
        let c = *self.data.get(self.pos).ok_or_else(|| EOF.to_owned())?;
        self.pos += 1;
        Ok(c)
    }

    fn peek(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(is_space) {
            self.pos += 1;
        }
    }

    fn document(&mut self) -> Result<(), String> {
        self.value()?;
        // After the top-level value only whitespace may follow; an unfinished container
        // is handled inside `value`.
        self.skip_space();
        match self.peek() {
            None => Ok(()),
            Some(c) => Err(invalid(c, "after top-level value")),
        }
    }

    /// One value, containers included (iteratively, so deep nesting cannot overflow).
    fn value(&mut self) -> Result<(), String> {
        let base = self.stack.len();
        'value: loop {
            // stateBeginValue
            self.skip_space();
            let c = self.next()?;
            if matches!(c, b'{' | b'[') && self.stack.len() >= MAX_NESTING_DEPTH {
                return Err(invalid(c, "exceeded max depth"));
            }
            match c {
                b'{' => {
                    self.skip_space();
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                    } else {
                        self.key()?;
                        self.stack.push(Frame::ObjectValue);
                        self.after_key()?;
                        continue 'value;
                    }
                }
                b'[' => {
                    self.skip_space();
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                    } else {
                        self.stack.push(Frame::Array);
                        continue 'value;
                    }
                }
                b'"' => self.string_body()?,
                b'-' => {
                    let d = self.next()?;
                    if !d.is_ascii_digit() {
                        return Err(invalid(d, "in numeric literal"));
                    }
                    self.number_rest(d)?;
                }
                b'0'..=b'9' => self.number_rest(c)?,
                b't' => self.literal(b"rue", "true")?,
                b'f' => self.literal(b"alse", "false")?,
                b'n' => self.literal(b"ull", "null")?,
                _ => return Err(invalid(c, "looking for beginning of value")),
            }
            // stateEndValue: close containers or move to the next element.
            loop {
                if self.stack.len() == base {
                    return Ok(());
                }
                self.skip_space();
                let c = self.next()?;
                let top = self.stack.len() - 1;
                match self.stack[top] {
                    Frame::ObjectValue => match c {
                        b',' => {
                            self.skip_space();
                            let k = self.next()?;
                            if k != b'"' {
                                return Err(invalid(
                                    k,
                                    "looking for beginning of object key string",
                                ));
                            }
                            self.string_body()?;
                            self.after_key()?;
                            continue 'value;
                        }
                        b'}' => {
                            self.stack.pop();
                        }
                        _ => return Err(invalid(c, "after object key:value pair")),
                    },
                    Frame::Array => match c {
                        b',' => continue 'value,
                        b']' => {
                            self.stack.pop();
                        }
                        _ => return Err(invalid(c, "after array element")),
                    },
                }
            }
        }
    }

    /// The first key of an object (just after `{` and whitespace).
    fn key(&mut self) -> Result<(), String> {
        let c = self.next()?;
        if c != b'"' {
            return Err(invalid(c, "looking for beginning of object key string"));
        }
        self.string_body()
    }

    /// After a key: the ':' (its value follows).
    fn after_key(&mut self) -> Result<(), String> {
        self.skip_space();
        let c = self.next()?;
        if c != b':' {
            return Err(invalid(c, "after object key"));
        }
        Ok(())
    }

    /// A string after its opening quote.
    fn string_body(&mut self) -> Result<(), String> {
        loop {
            let c = self.next()?;
            match c {
                b'"' => return Ok(()),
                b'\\' => {
                    let e = self.next()?;
                    match e {
                        b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {}
                        b'u' => {
                            for _ in 0..4 {
                                let h = self.next()?;
                                if !h.is_ascii_hexdigit() {
                                    return Err(invalid(h, "in \\u hexadecimal character escape"));
                                }
                            }
                        }
                        _ => return Err(invalid(e, "in string escape code")),
                    }
                }
                c if c < 0x20 => return Err(invalid(c, "in string literal")),
                _ => {}
            }
        }
    }

    /// A number after its first digit `first`.
    fn number_rest(&mut self, first: u8) -> Result<(), String> {
        if first != b'0' {
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let d = self.next()?;
            if !d.is_ascii_digit() {
                return Err(invalid(d, "after decimal point in numeric literal"));
            }
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            let mut d = self.next()?;
            if d == b'+' || d == b'-' {
                d = self.next()?;
            }
            if !d.is_ascii_digit() {
                return Err(invalid(d, "in exponent of numeric literal"));
            }
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
        }
        Ok(())
    }

    fn literal(&mut self, rest: &[u8], word: &str) -> Result<(), String> {
        for want in rest {
            let c = self.next()?;
            if c != *want {
                return Err(invalid(
                    c,
                    &format!("in literal {word} (expecting {})", quote_char(*want)),
                ));
            }
        }
        Ok(())
    }
}

/// Where Go's `base64.StdEncoding` gives up on `s` (the N of `illegal base64 data at input
/// byte N`), or None if it decodes: how kube-apiserver refuses a `[]byte` field (Secret
/// data, ConfigMap binaryData) that is not base64. Newlines are skipped; padding is
/// required.
pub fn base64_error(s: &[u8]) -> Option<usize> {
    base64_offset(s, false)
}

/// As [`base64_error`] for Go's `base64.RawURLEncoding` (`-_` alphabet, no padding), which
/// continue tokens use.
pub fn base64_raw_url_error(s: &[u8]) -> Option<usize> {
    base64_offset(s, true)
}

fn base64_offset(s: &[u8], raw_url: bool) -> Option<usize> {
    let valid = |c: u8| {
        c.is_ascii_alphanumeric()
            || if raw_url {
                c == b'-' || c == b'_'
            } else {
                c == b'+' || c == b'/'
            }
    };
    let newline = |c: u8| c == b'\n' || c == b'\r';
    let mut si = 0;
    loop {
        // One quantum of four symbols.
        let mut j = 0;
        while j < 4 {
            let Some(&c) = s.get(si) else {
                // Without padding a final quantum of two or three symbols is whole.
                return match j {
                    0 => None,
                    2 | 3 if raw_url => None,
                    _ => Some(si - j),
                };
            };
            si += 1;
            if valid(c) {
                j += 1;
                continue;
            }
            if newline(c) {
                continue;
            }
            if raw_url || c != b'=' || j < 2 {
                return Some(si - 1);
            }
            if j == 2 {
                // A second '=' must follow (newlines aside).
                while s.get(si).copied().is_some_and(newline) {
                    si += 1;
                }
                match s.get(si) {
                    None => return Some(s.len()),
                    Some(b'=') => si += 1,
                    Some(_) => return Some(si - 1),
                }
            }
            while s.get(si).copied().is_some_and(newline) {
                si += 1;
            }
            return (si < s.len()).then_some(si);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{base64_error, base64_raw_url_error, syntax_error};

    #[test]
    fn nesting_past_go_limit_is_refused_at_the_opening_character() {
        // kube-apiserver v1.37.2's answer for `{"a":[` 20000 times.
        let deep = "{\"a\":[".repeat(20_000);
        assert_eq!(
            syntax_error(deep.as_bytes()).as_deref(),
            Some("invalid character '{' exceeded max depth")
        );
        let ok = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(syntax_error(ok.as_bytes()), None);
        let over = format!("{}{}", "[".repeat(10_001), "]".repeat(10_001));
        assert_eq!(
            syntax_error(over.as_bytes()).as_deref(),
            Some("invalid character '[' exceeded max depth")
        );
    }

    #[test]
    fn messages_are_go_encoding_json_ones() {
        let cases: &[(&[u8], Option<&str>)] = &[
            (b"{\"a\": [1, 2.5e3, true, null, \"x\\u00e9\"]}", None),
            (b"  {}  ", None),
            (b"", Some("unexpected end of JSON input")),
            (b"   ", Some("unexpected end of JSON input")),
            (
                b"{\"metadata\": {\"name\": \"x\"}",
                Some("unexpected end of JSON input"),
            ),
            (
                b"{\"a\":1} x",
                Some("invalid character 'x' after top-level value"),
            ),
            (
                b"{a:1}",
                Some("invalid character 'a' looking for beginning of object key string"),
            ),
            (b"{\"a\" 1}", Some("invalid character '1' after object key")),
            (
                b"{\"a\":1 \"b\":2}",
                Some("invalid character '\"' after object key:value pair"),
            ),
            (
                b"{\"a\":1,}",
                Some("invalid character '}' looking for beginning of object key string"),
            ),
            (b"[1 2]", Some("invalid character '2' after array element")),
            (
                b"[1,]",
                Some("invalid character ']' looking for beginning of value"),
            ),
            (b"-x", Some("invalid character 'x' in numeric literal")),
            (
                b"1.x",
                Some("invalid character 'x' after decimal point in numeric literal"),
            ),
            (
                b"1ex",
                Some("invalid character 'x' in exponent of numeric literal"),
            ),
            (b"tru", Some("unexpected end of JSON input")),
            (
                b"nul!",
                Some("invalid character '!' in literal null (expecting 'l')"),
            ),
            (
                b"\"\\q\"",
                Some("invalid character 'q' in string escape code"),
            ),
            (
                b"\"\\u12g4\"",
                Some("invalid character 'g' in \\u hexadecimal character escape"),
            ),
            (
                b"\"a\nb\"",
                Some("invalid character '\\n' in string literal"),
            ),
            (
                b"'a'",
                Some("invalid character '\\'' looking for beginning of value"),
            ),
            (
                &[0x9e],
                Some("invalid character '\\u009e' looking for beginning of value"),
            ),
            (b"01", Some("invalid character '1' after top-level value")),
        ];
        for (input, want) in cases {
            assert_eq!(
                syntax_error(input).as_deref(),
                *want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn base64_offsets_are_go_ones() {
        // Offsets observed from Go's base64.StdEncoding.DecodeString.
        let cases: &[(&str, Option<usize>)] = &[
            ("YWJj", None),
            ("", None),
            ("YQ==", None),
            ("YWI=", None),
            ("YWJj\nZGVm", None),
            ("!!!", Some(0)),
            ("YWI", Some(0)),
            ("YW=j", Some(2)),
            ("YQ==YQ==", Some(4)),
            ("Y", Some(0)),
            ("YQ=", Some(3)),
            ("YQ", Some(0)),
            ("a\nb", Some(1)),
            ("YQ=a", Some(2)),
            ("YQ===", Some(4)),
            ("YWJjZA", Some(4)),
            ("YWJjZA=", Some(7)),
            ("YW Jj", Some(2)),
            ("=", Some(0)),
            ("YWJj=", Some(4)),
        ];
        for (input, want) in cases {
            assert_eq!(base64_error(input.as_bytes()), *want, "{input:?}");
        }
    }

    #[test]
    fn raw_url_base64_offsets_are_go_ones() {
        let cases: &[(&str, Option<usize>)] = &[
            ("not-a-token", None),
            ("YWJjZA", None),
            ("YQ", None),
            ("Y", Some(0)),
            ("YWJjZ", Some(4)),
            ("YQ==", Some(2)),
            ("a+b", Some(1)),
        ];
        for (input, want) in cases {
            assert_eq!(base64_raw_url_error(input.as_bytes()), *want, "{input:?}");
        }
    }

    #[test]
    fn deep_nesting_does_not_overflow() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert_eq!(
            syntax_error(deep.as_bytes()).as_deref(),
            Some("invalid character '[' exceeded max depth")
        );
        let open = "{\"a\":".repeat(50_000);
        assert_eq!(
            syntax_error(open.as_bytes()).as_deref(),
            Some("invalid character '{' exceeded max depth")
        );
    }
}
