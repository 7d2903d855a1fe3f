//! The classroom's users: a file of `name:role:pbkdf2-sha256$<iterations>$<salt>$<hash>`
//! lines (role `learner` or `instructor`), passwords kept only as salted PBKDF2-HMAC-SHA256
//! hashes and checked in constant time.

use std::num::NonZeroU32;
use std::path::Path;

use base64::Engine;

use crate::Error;

const ITERATIONS: u32 = 100_000;
const ALGORITHM: ring::pbkdf2::Algorithm = ring::pbkdf2::PBKDF2_HMAC_SHA256;

/// A user's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Learner,
    Instructor,
}

#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub role: Role,
    hash: String,
}

/// A user name a namespace can carry (`handson-<name>`): lower-case letters, digits and
/// hyphens, starting with a letter, at most 40 characters.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The stored form of `password`.
pub fn hash_password(password: &str) -> String {
    let salt: [u8; 16] = rand::random();
    let mut out = [0u8; 32];
    ring::pbkdf2::derive(
        ALGORITHM,
        NonZeroU32::new(ITERATIONS).unwrap_or(NonZeroU32::MIN),
        &salt,
        password.as_bytes(),
        &mut out,
    );
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD;
    format!(
        "pbkdf2-sha256${ITERATIONS}${}${}",
        b64.encode(salt),
        b64.encode(out)
    )
}

impl User {
    /// Whether `password` is this user's (constant time).
    pub fn verify(&self, password: &str) -> bool {
        verify(&self.hash, password)
    }
}

fn verify(stored: &str, password: &str) -> bool {
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD;
    let mut parts = stored.split('$');
    let (Some("pbkdf2-sha256"), Some(iter), Some(salt), Some(hash)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Some(iter), Ok(salt), Ok(hash)) = (
        iter.parse::<u32>().ok().and_then(NonZeroU32::new),
        b64.decode(salt),
        b64.decode(hash),
    ) else {
        return false;
    };
    ring::pbkdf2::verify(ALGORITHM, iter, &salt, password.as_bytes(), &hash).is_ok()
}

/// Reads the users file (missing: no users).
pub fn load(path: &Path) -> Result<Vec<User>, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::Io(path.display().to_string(), e)),
    };
    let mut users = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut f = line.splitn(3, ':');
        let (Some(name), Some(role), Some(hash)) = (f.next(), f.next(), f.next()) else {
            return Err(Error::Invalid(format!(
                "{}:{}: expected name:role:hash",
                path.display(),
                i + 1
            )));
        };
        let role = match role {
            "learner" => Role::Learner,
            "instructor" => Role::Instructor,
            r => {
                return Err(Error::Invalid(format!(
                    "{}:{}: unknown role {r:?}",
                    path.display(),
                    i + 1
                )))
            }
        };
        if !valid_name(name) {
            return Err(Error::Invalid(format!(
                "{}:{}: invalid user name {name:?}",
                path.display(),
                i + 1
            )));
        }
        users.push(User {
            name: name.to_owned(),
            role,
            hash: hash.to_owned(),
        });
    }
    Ok(users)
}

/// Adds (or replaces) user `name` with a new random password, which is returned.
pub fn add(path: &Path, name: &str, role: Role) -> Result<String, Error> {
    if !valid_name(name) {
        return Err(Error::Invalid(format!(
            "invalid user name {name:?}: lower-case letters, digits and hyphens, starting with a letter, at most 40"
        )));
    }
    const ALPHABET: &[u8] = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let password: String = (0..16)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect();
    let role_text = match role {
        Role::Learner => "learner",
        Role::Instructor => "instructor",
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.split(':').next() != Some(name))
        .map(str::to_owned)
        .collect();
    lines.push(format!("{name}:{role_text}:{}", hash_password(&password)));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io(dir.display().to_string(), e))?;
    }
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::Io(path.display().to_string(), e))?;
    f.write_all((lines.join("\n") + "\n").as_bytes())
        .map_err(|e| Error::Io(path.display().to_string(), e))?;
    Ok(password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_verify_only_themselves() {
        let h = hash_password("s3cret");
        assert!(h.starts_with("pbkdf2-sha256$100000$"));
        assert!(verify(&h, "s3cret"));
        assert!(!verify(&h, "s3cre"));
        assert!(!verify("garbage", "s3cret"));
        assert!(!verify("pbkdf2-sha256$0$AA$AA", "s3cret"));
    }

    #[test]
    fn names_fit_a_namespace() {
        assert!(valid_name("alice"));
        assert!(valid_name("bob-2"));
        for bad in ["", "Alice", "-a", "a-", "a_b", "a.b", &"a".repeat(41)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
