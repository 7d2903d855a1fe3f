//! The sim shell's grammar: a POSIX `sh` subset (lists, `&&`/`||`, pipes, `if`, `while`,
//! `until`, `for`, `case`, `{ }`, `( )`, functions, redirections, here-documents, `[[ ]]`)
//! parsed into a tree whose words are expanded only when they run.

use std::rc::Rc;

/// A piece of a word.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Unquoted text.
    Lit(String),
    /// Quoted text (no splitting, no globbing).
    Quoted(String),
    /// `$NAME` (quoted when inside double quotes).
    Var(String, bool),
    /// `${...}`: what is between the braces.
    Param(String, bool),
    /// `$(...)` or backticks: the script.
    Cmd(String, bool),
    /// `$((...))`: the expression.
    Arith(String, bool),
}

pub type Word = Vec<Part>;

/// A redirection: `fd op target`.
#[derive(Clone, Debug, PartialEq)]
pub struct Redir {
    pub fd: u32,
    /// `>`, `>>`, `<`, `>&`, `<&`, `<<`.
    pub op: String,
    pub target: Word,
}

/// A command.
#[derive(Clone, Debug, PartialEq)]
pub enum Cmd {
    Simple {
        assigns: Vec<(String, Word)>,
        words: Vec<Word>,
        redirs: Vec<Redir>,
    },
    If {
        arms: Vec<(List, List)>,
        els: Option<List>,
        redirs: Vec<Redir>,
    },
    Loop {
        until: bool,
        cond: List,
        body: List,
        redirs: Vec<Redir>,
    },
    For {
        var: String,
        items: Option<Vec<Word>>,
        body: List,
        redirs: Vec<Redir>,
    },
    Case {
        word: Word,
        arms: Vec<(Vec<Word>, List)>,
        redirs: Vec<Redir>,
    },
    Group {
        body: List,
        subshell: bool,
        redirs: Vec<Redir>,
    },
    Func {
        name: String,
        body: Rc<Cmd>,
    },
}

/// Commands joined by `|` (`!` negates its status).
#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    pub neg: bool,
    pub cmds: Vec<Cmd>,
}

/// Pipelines joined by `&&` (true) or `||` (false); run in the background after `&`.
#[derive(Clone, Debug, PartialEq)]
pub struct AndOr {
    pub first: Pipeline,
    pub rest: Vec<(bool, Pipeline)>,
    pub background: bool,
}

pub type List = Vec<AndOr>;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(Word),
    Op(&'static str),
    Nl,
    Redir(Redir),
}

/// Why a script cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub struct SyntaxError(pub String);

/// The index just after the `close` that matches the `open` already consumed at
/// `start`, skipping quoted text.
fn matching(chars: &[char], mut i: usize, open: char, close: char) -> Option<usize> {
    let mut depth = 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '\'' => {
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_name(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Reads a `$` expansion at `chars[i]` (just after the `$`).
fn dollar(chars: &[char], i: &mut usize, quoted: bool) -> Result<Part, SyntaxError> {
    let err = || SyntaxError("unterminated expansion".into());
    let text = |a: usize, b: usize| chars[a..b].iter().collect::<String>();
    match chars.get(*i) {
        Some('(') if chars.get(*i + 1) == Some(&'(') => {
            let end = matching(chars, *i + 2, '(', ')').ok_or_else(err)?;
            // `$((expr))`: the closing `))`.
            if chars.get(end) == Some(&')') {
                let inner = text(*i + 2, end - 1);
                *i = end + 1;
                Ok(Part::Arith(inner, quoted))
            } else {
                let end = matching(chars, *i + 1, '(', ')').ok_or_else(err)?;
                let inner = text(*i + 1, end - 1);
                *i = end;
                Ok(Part::Cmd(inner, quoted))
            }
        }
        Some('(') => {
            let end = matching(chars, *i + 1, '(', ')').ok_or_else(err)?;
            let inner = text(*i + 1, end - 1);
            *i = end;
            Ok(Part::Cmd(inner, quoted))
        }
        Some('{') => {
            let end = matching(chars, *i + 1, '{', '}').ok_or_else(err)?;
            let inner = text(*i + 1, end - 1);
            *i = end;
            Ok(Part::Param(inner, quoted))
        }
        Some(&c) if is_name_start(c) => {
            let start = *i;
            while *i < chars.len() && is_name(chars[*i]) {
                *i += 1;
            }
            Ok(Part::Var(text(start, *i), quoted))
        }
        Some(&c) if c.is_ascii_digit() || "?$#@*!-".contains(c) => {
            *i += 1;
            Ok(Part::Var(c.to_string(), quoted))
        }
        _ => Ok(if quoted {
            Part::Quoted("$".into())
        } else {
            Part::Lit("$".into())
        }),
    }
}

/// The parts of double-quoted text (`chars[i]` just after the opening quote; with
/// `close` false, all of `chars`, as a here-document or `${x:-word}`).
fn double_quoted(chars: &[char], i: &mut usize, close: bool) -> Result<Word, SyntaxError> {
    let mut parts = Vec::new();
    let mut lit = String::new();
    let flush = |lit: &mut String, parts: &mut Word| {
        if !lit.is_empty() {
            parts.push(Part::Quoted(std::mem::take(lit)));
        }
    };
    loop {
        let Some(&c) = chars.get(*i) else {
            if close {
                return Err(SyntaxError("unterminated quoted string".into()));
            }
            break;
        };
        *i += 1;
        match c {
            '"' if close => break,
            '\\' => match chars.get(*i) {
                Some(&n @ ('"' | '\\' | '$' | '`')) => {
                    lit.push(n);
                    *i += 1;
                }
                Some('\n') => *i += 1,
                _ => lit.push('\\'),
            },
            '$' => {
                flush(&mut lit, &mut parts);
                parts.push(dollar(chars, i, true)?);
            }
            '`' => {
                flush(&mut lit, &mut parts);
                let start = *i;
                while *i < chars.len() && chars[*i] != '`' {
                    *i += 1;
                }
                parts.push(Part::Cmd(chars[start..*i].iter().collect(), true));
                *i += 1;
            }
            c => lit.push(c),
        }
    }
    flush(&mut lit, &mut parts);
    Ok(parts)
}

/// The word of `text` read as double-quoted content.
pub fn quoted_word(text: &str) -> Result<Word, SyntaxError> {
    let chars: Vec<char> = text.chars().collect();
    double_quoted(&chars, &mut 0, false)
}

fn is_meta(c: char) -> bool {
    matches!(
        c,
        ' ' | '\t' | '\n' | ';' | '&' | '|' | '<' | '>' | '(' | ')'
    )
}

/// Reads one word at `chars[i]`.
fn word(chars: &[char], i: &mut usize, in_test: bool) -> Result<Word, SyntaxError> {
    let mut parts = Vec::new();
    let mut lit = String::new();
    let flush = |lit: &mut String, parts: &mut Word| {
        if !lit.is_empty() {
            parts.push(Part::Lit(std::mem::take(lit)));
        }
    };
    while let Some(&c) = chars.get(*i) {
        // Inside `[[ ]]` only blanks and `;` end a word.
        let ends = if in_test {
            matches!(c, ' ' | '\t' | '\n' | ';')
        } else {
            is_meta(c)
        };
        if ends {
            break;
        }
        *i += 1;
        match c {
            '\'' => {
                flush(&mut lit, &mut parts);
                let start = *i;
                while *i < chars.len() && chars[*i] != '\'' {
                    *i += 1;
                }
                if *i >= chars.len() {
                    return Err(SyntaxError("unterminated quoted string".into()));
                }
                parts.push(Part::Quoted(chars[start..*i].iter().collect()));
                *i += 1;
            }
            '"' => {
                flush(&mut lit, &mut parts);
                let w = double_quoted(chars, i, true)?;
                if w.is_empty() {
                    parts.push(Part::Quoted(String::new()));
                }
                parts.extend(w);
            }
            '\\' => match chars.get(*i) {
                Some('\n') => *i += 1,
                Some(&n) => {
                    flush(&mut lit, &mut parts);
                    parts.push(Part::Quoted(n.to_string()));
                    *i += 1;
                }
                None => {}
            },
            '$' => {
                flush(&mut lit, &mut parts);
                parts.push(dollar(chars, i, false)?);
            }
            '`' => {
                flush(&mut lit, &mut parts);
                let start = *i;
                while *i < chars.len() && chars[*i] != '`' {
                    *i += 1;
                }
                parts.push(Part::Cmd(chars[start..*i].iter().collect(), false));
                *i += 1;
            }
            c => lit.push(c),
        }
    }
    flush(&mut lit, &mut parts);
    Ok(parts)
}

/// The literal text of a word with no quoting or expansion.
pub fn plain(w: &Word) -> Option<&str> {
    match w.as_slice() {
        [Part::Lit(s)] => Some(s),
        _ => None,
    }
}

fn tokenize(script: &str) -> Result<Vec<Tok>, SyntaxError> {
    let chars: Vec<char> = script.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    // Here-documents waiting for the end of the line: (token index, delimiter, strip tabs).
    let mut heredocs: Vec<(usize, String, bool)> = Vec::new();
    let mut in_test = false;
    let mut at_word_start = true;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => {
                i += 1;
                at_word_start = true;
                continue;
            }
            '#' if at_word_start => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '\\' if chars.get(i + 1) == Some(&'\n') => {
                i += 2;
                continue;
            }
            '\n' => {
                i += 1;
                toks.push(Tok::Nl);
                for (at, delim, strip) in std::mem::take(&mut heredocs) {
                    let mut body = String::new();
                    loop {
                        if i >= chars.len() {
                            break;
                        }
                        let end = chars[i..]
                            .iter()
                            .position(|c| *c == '\n')
                            .map_or(chars.len(), |p| i + p);
                        let line: String = chars[i..end].iter().collect();
                        i = (end + 1).min(chars.len());
                        let line = if strip {
                            line.trim_start_matches('\t').to_owned()
                        } else {
                            line
                        };
                        if line == delim {
                            break;
                        }
                        body.push_str(&line);
                        body.push('\n');
                    }
                    if let Some(Tok::Redir(r)) = toks.get_mut(at) {
                        r.target = match r.target.first() {
                            Some(Part::Quoted(_)) => vec![Part::Quoted(body)],
                            _ => quoted_word(&body)?,
                        };
                    }
                }
                continue;
            }
            _ => {}
        }
        at_word_start = false;
        if in_test && !matches!(c, ' ' | '\t' | '\n' | ';') {
            let w = word(&chars, &mut i, true)?;
            if plain(&w) == Some("]]") {
                in_test = false;
            }
            toks.push(Tok::Word(w));
            at_word_start = true;
            continue;
        }
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        let op: Option<&'static str> = match two.as_str() {
            "&&" => Some("&&"),
            "||" => Some("||"),
            ";;" => Some(";;"),
            _ => match c {
                ';' => Some(";"),
                '&' => Some("&"),
                '|' => Some("|"),
                '(' => Some("("),
                ')' => Some(")"),
                _ => None,
            },
        };
        if let Some(op) = op {
            i += op.len();
            toks.push(Tok::Op(op));
            at_word_start = true;
            continue;
        }
        // A redirection, with an optional fd number before it.
        let mut j = i;
        while j < chars.len() && chars[j].is_ascii_digit() {
            j += 1;
        }
        if j < chars.len() && matches!(chars[j], '<' | '>') {
            let fd_text: String = chars[i..j].iter().collect();
            let out = chars[j] == '>';
            let mut k = j + 1;
            let op = match (chars[j], chars.get(k)) {
                ('>', Some('>')) => {
                    k += 1;
                    ">>"
                }
                ('>', Some('&')) => {
                    k += 1;
                    ">&"
                }
                ('>', Some('|')) => {
                    k += 1;
                    ">"
                }
                ('<', Some('&')) => {
                    k += 1;
                    "<&"
                }
                ('<', Some('<')) => {
                    k += 1;
                    if chars.get(k) == Some(&'-') {
                        k += 1;
                        "<<-"
                    } else {
                        "<<"
                    }
                }
                _ if out => ">",
                _ => "<",
            };
            let fd = fd_text.parse().unwrap_or(if out { 1 } else { 0 });
            i = k;
            while i < chars.len() && matches!(chars[i], ' ' | '\t') {
                i += 1;
            }
            let target = word(&chars, &mut i, false)?;
            if target.is_empty() {
                return Err(SyntaxError("missing redirection target".into()));
            }
            if op.starts_with("<<") {
                let delim: String = target
                    .iter()
                    .map(|p| match p {
                        Part::Lit(s) | Part::Quoted(s) => s.clone(),
                        _ => String::new(),
                    })
                    .collect();
                let quoted = target.iter().any(|p| matches!(p, Part::Quoted(_)));
                heredocs.push((toks.len(), delim, op == "<<-"));
                toks.push(Tok::Redir(Redir {
                    fd,
                    op: "<<".into(),
                    target: if quoted {
                        vec![Part::Quoted(String::new())]
                    } else {
                        vec![Part::Lit(String::new())]
                    },
                }));
            } else {
                toks.push(Tok::Redir(Redir {
                    fd,
                    op: op.into(),
                    target,
                }));
            }
            at_word_start = true;
            continue;
        }
        let w = word(&chars, &mut i, false)?;
        if plain(&w) == Some("[[") {
            in_test = true;
        }
        toks.push(Tok::Word(w));
    }
    if !heredocs.is_empty() {
        // A here-document at the very end of the script: its body is empty.
        toks.push(Tok::Nl);
    }
    Ok(toks)
}

struct Parser {
    toks: Vec<Tok>,
    i: usize,
}

fn err<T>(msg: &str) -> Result<T, SyntaxError> {
    Err(SyntaxError(msg.into()))
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i)
    }

    fn kw(&self, k: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(w)) if plain(w) == Some(k))
    }

    fn op(&self, o: &str) -> bool {
        matches!(self.peek(), Some(Tok::Op(x)) if *x == o)
    }

    fn expect_kw(&mut self, k: &str) -> Result<(), SyntaxError> {
        if self.kw(k) {
            self.i += 1;
            Ok(())
        } else {
            err(&format!("{} (expecting \"{k}\")", self.unexpected()))
        }
    }

    /// busybox's message for the token here.
    fn unexpected(&self) -> String {
        match self.peek() {
            None => "syntax error: unexpected end of file".into(),
            Some(Tok::Nl) => "syntax error: unexpected newline".into(),
            Some(Tok::Op(o)) => format!("syntax error: unexpected \"{o}\""),
            Some(Tok::Word(w)) => match plain(w) {
                Some(t) => format!("syntax error: unexpected \"{t}\""),
                None => "syntax error: unexpected word".into(),
            },
            Some(Tok::Redir(_)) => "syntax error: unexpected redirection".into(),
        }
    }

    /// A list that must have a command (an `if` condition, a loop's body).
    fn nonempty(&mut self, stop: &[&str]) -> Result<List, SyntaxError> {
        let l = self.list(stop)?;
        if l.is_empty() {
            return Err(SyntaxError(self.unexpected()));
        }
        Ok(l)
    }

    fn newlines(&mut self) {
        while matches!(self.peek(), Some(Tok::Nl)) {
            self.i += 1;
        }
    }

    fn list(&mut self, stop: &[&str]) -> Result<List, SyntaxError> {
        let mut list = Vec::new();
        loop {
            while matches!(self.peek(), Some(Tok::Nl)) || self.op(";") {
                self.i += 1;
            }
            match self.peek() {
                None | Some(Tok::Op(")" | ";;")) => break,
                Some(Tok::Word(w)) if plain(w).is_some_and(|k| stop.contains(&k)) => break,
                _ => {}
            }
            let mut ao = self.and_or()?;
            if self.op("&") {
                self.i += 1;
                ao.background = true;
            } else if self.op(";") || matches!(self.peek(), Some(Tok::Nl)) {
                self.i += 1;
            }
            list.push(ao);
        }
        Ok(list)
    }

    fn and_or(&mut self) -> Result<AndOr, SyntaxError> {
        let first = self.pipeline()?;
        let mut rest = Vec::new();
        loop {
            let and = if self.op("&&") {
                true
            } else if self.op("||") {
                false
            } else {
                break;
            };
            self.i += 1;
            self.newlines();
            rest.push((and, self.pipeline()?));
        }
        Ok(AndOr {
            first,
            rest,
            background: false,
        })
    }

    fn pipeline(&mut self) -> Result<Pipeline, SyntaxError> {
        let neg = self.kw("!");
        if neg {
            self.i += 1;
        }
        let mut cmds = vec![self.command()?];
        while self.op("|") {
            self.i += 1;
            self.newlines();
            cmds.push(self.command()?);
        }
        Ok(Pipeline { neg, cmds })
    }

    fn redirs(&mut self) -> Vec<Redir> {
        let mut out = Vec::new();
        while let Some(Tok::Redir(r)) = self.peek() {
            out.push(r.clone());
            self.i += 1;
        }
        out
    }

    fn command(&mut self) -> Result<Cmd, SyntaxError> {
        if self.kw("if") {
            self.i += 1;
            let mut arms = Vec::new();
            let mut els = None;
            loop {
                let cond = self.nonempty(&["then"])?;
                self.expect_kw("then")?;
                let body = self.nonempty(&["elif", "else", "fi"])?;
                arms.push((cond, body));
                if self.kw("elif") {
                    self.i += 1;
                    continue;
                }
                if self.kw("else") {
                    self.i += 1;
                    els = Some(self.list(&["fi"])?);
                }
                self.expect_kw("fi")?;
                break;
            }
            let redirs = self.redirs();
            return Ok(Cmd::If { arms, els, redirs });
        }
        if self.kw("while") || self.kw("until") {
            let until = self.kw("until");
            self.i += 1;
            let cond = self.nonempty(&["do"])?;
            self.expect_kw("do")?;
            let body = self.list(&["done"])?;
            self.expect_kw("done")?;
            let redirs = self.redirs();
            return Ok(Cmd::Loop {
                until,
                cond,
                body,
                redirs,
            });
        }
        if self.kw("for") {
            self.i += 1;
            let var = match self.peek() {
                Some(Tok::Word(w)) => plain(w).map(str::to_owned),
                _ => None,
            }
            .ok_or_else(|| SyntaxError("syntax error: bad for loop variable".into()))?;
            self.i += 1;
            self.newlines();
            let mut items = None;
            if self.kw("in") {
                self.i += 1;
                let mut words = Vec::new();
                while let Some(Tok::Word(w)) = self.peek() {
                    words.push(w.clone());
                    self.i += 1;
                }
                items = Some(words);
            }
            while self.op(";") || matches!(self.peek(), Some(Tok::Nl)) {
                self.i += 1;
            }
            self.expect_kw("do")?;
            let body = self.list(&["done"])?;
            self.expect_kw("done")?;
            let redirs = self.redirs();
            return Ok(Cmd::For {
                var,
                items,
                body,
                redirs,
            });
        }
        if self.kw("case") {
            self.i += 1;
            let Some(Tok::Word(word)) = self.peek().cloned() else {
                return err("syntax error: bad case");
            };
            self.i += 1;
            self.newlines();
            self.expect_kw("in")?;
            let mut arms = Vec::new();
            loop {
                self.newlines();
                if self.kw("esac") {
                    self.i += 1;
                    break;
                }
                if self.op("(") {
                    self.i += 1;
                }
                let mut pats = Vec::new();
                loop {
                    match self.peek() {
                        Some(Tok::Word(w)) => {
                            pats.push(w.clone());
                            self.i += 1;
                        }
                        _ => return err("syntax error: bad case pattern"),
                    }
                    if self.op("|") {
                        self.i += 1;
                    } else {
                        break;
                    }
                }
                if !self.op(")") {
                    return err("syntax error: expected \")\"");
                }
                self.i += 1;
                let body = self.list(&["esac"])?;
                if self.op(";;") {
                    self.i += 1;
                }
                arms.push((pats, body));
            }
            let redirs = self.redirs();
            return Ok(Cmd::Case { word, arms, redirs });
        }
        if self.kw("{") {
            self.i += 1;
            let body = self.list(&["}"])?;
            self.expect_kw("}")?;
            let redirs = self.redirs();
            return Ok(Cmd::Group {
                body,
                subshell: false,
                redirs,
            });
        }
        if self.op("(") {
            self.i += 1;
            let body = self.list(&[])?;
            if !self.op(")") {
                return err("syntax error: expected \")\"");
            }
            self.i += 1;
            let redirs = self.redirs();
            return Ok(Cmd::Group {
                body,
                subshell: true,
                redirs,
            });
        }
        // `name() body`.
        if let (Some(Tok::Word(w)), Some(Tok::Op("(")), Some(Tok::Op(")"))) = (
            self.peek(),
            self.toks.get(self.i + 1),
            self.toks.get(self.i + 2),
        ) {
            if let Some(name) = plain(w).map(str::to_owned) {
                self.i += 3;
                self.newlines();
                let body = self.command()?;
                return Ok(Cmd::Func {
                    name,
                    body: Rc::new(body),
                });
            }
        }
        let mut assigns = Vec::new();
        let mut words = Vec::new();
        let mut redirs = Vec::new();
        loop {
            match self.peek() {
                Some(Tok::Word(w)) => {
                    let w = w.clone();
                    self.i += 1;
                    if words.is_empty() {
                        if let Some(Part::Lit(first)) = w.first() {
                            if let Some((name, value)) = first.split_once('=') {
                                if name.starts_with(is_name_start) && name.chars().all(is_name) {
                                    let mut v: Word = Vec::new();
                                    if !value.is_empty() {
                                        v.push(Part::Lit(value.to_owned()));
                                    }
                                    v.extend(w[1..].iter().cloned());
                                    assigns.push((name.to_owned(), v));
                                    continue;
                                }
                            }
                        }
                    }
                    words.push(w);
                }
                Some(Tok::Redir(r)) => {
                    redirs.push(r.clone());
                    self.i += 1;
                }
                _ => break,
            }
        }
        if assigns.is_empty() && words.is_empty() && redirs.is_empty() {
            return Err(SyntaxError(self.unexpected()));
        }
        Ok(Cmd::Simple {
            assigns,
            words,
            redirs,
        })
    }
}

/// Parses a script.
pub fn parse(script: &str) -> Result<List, SyntaxError> {
    let toks = tokenize(script)?;
    let mut p = Parser { toks, i: 0 };
    let list = p.list(&[])?;
    if p.i < p.toks.len() {
        return Err(SyntaxError(p.unexpected()));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        let l =
            parse("if [[ -r /data/foo ]]\nthen\n exit 0\nelse\n touch /data/foo\n exit 1\nfi\n")
                .expect("if");
        assert_eq!(l.len(), 1);
        assert!(
            matches!(&l[0].first.cmds[0], Cmd::If { arms, els: Some(_), .. } if arms.len() == 1)
        );
        let l = parse("count=$(echo 'hello' >> $f ; wc -l $f | awk {'print $1'})").expect("subst");
        assert!(
            matches!(&l[0].first.cmds[0], Cmd::Simple { assigns, words, .. } if assigns.len() == 1 && words.is_empty())
        );
        let l = parse("while true; do sleep 1; done & wait").expect("bg");
        assert!(l[0].background);
        assert_eq!(l.len(), 2);
        assert!(parse("_term(){\n echo x\n}\ntrap _term TERM").is_ok());
        assert!(parse("case $x in a|b) echo ab;; *) echo other;; esac").is_ok());
        assert!(parse("cat <<EOF\nhello $x\nEOF\necho after").is_ok());
        assert!(parse("if true; then").is_err());
        assert!(parse("echo 'unterminated").is_err());
    }
}
