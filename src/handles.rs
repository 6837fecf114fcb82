//! Handles (SPEC §5): an agent's handle is the shortest prefix of its UUID,
//! at least 4 characters, that no other open agent of the same user shares.
//! Derived from the two neighbours in id order (never a scan), never stored.
//! Resolution sanitises input so nothing but `[0-9a-f-]` reaches SQL; a
//! full UUID also finds closed agents. Other users' agents are never found.

use crate::core::Core;
use crate::db::agents::{self, AgentRow};
use crate::db::DbError;

/// The shortest handle length.
pub const MIN_HANDLE: usize = 4;

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// The handle of `id` given its open neighbours in id order.
pub fn from_neighbours(id: &str, prev: Option<&str>, next: Option<&str>) -> String {
    let shared = prev
        .map(|p| common_prefix(id, p))
        .unwrap_or(0)
        .max(next.map(|n| common_prefix(id, n)).unwrap_or(0));
    let len = (shared + 1).max(MIN_HANDLE).min(id.len());
    id[..len].to_string()
}

/// Why a reference is unusable before it reaches the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefError {
    TooShort,
    BadCharacter(char),
}

impl std::fmt::Display for RefError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooShort => write!(
                f,
                "an agent reference needs at least {MIN_HANDLE} characters"
            ),
            Self::BadCharacter(c) => write!(
                f,
                "an agent reference may only contain 0-9, a-f and '-' (found {c:?})"
            ),
        }
    }
}

/// Lowercases and checks a handle or UUID.
pub fn sanitize(input: &str) -> Result<String, RefError> {
    let s = input.trim().to_ascii_lowercase();
    if let Some(c) = s
        .chars()
        .find(|c| !matches!(c, '0'..='9' | 'a'..='f' | '-'))
    {
        return Err(RefError::BadCharacter(c));
    }
    if s.len() < MIN_HANDLE {
        return Err(RefError::TooShort);
    }
    Ok(s)
}

/// The exclusive upper bound of ids starting with `prefix` (a sanitised
/// prefix only holds characters below 'g').
pub fn range_end(prefix: &str) -> String {
    format!("{prefix}g")
}

/// True for a full lowercase UUID.
pub fn is_full_uuid(s: &str) -> bool {
    s.len() == 36 && uuid::Uuid::parse_str(s).is_ok()
}

// Resolution against the database.

/// How a reference resolved.
#[derive(Debug)]
pub enum Resolved {
    Ok(Box<AgentRow>),
    /// Nothing matches; the open handles of the user (up to 10).
    None(Vec<String>),
    /// Several match; their handles.
    Ambiguous(Vec<String>),
    /// Not a possible reference.
    Invalid(RefError),
}

/// Resolves `r` for `user`.
pub async fn resolve(core: &Core, user: &str, r: &str) -> Result<Resolved, DbError> {
    let s = match sanitize(r) {
        Ok(s) => s,
        Err(e) => return Ok(Resolved::Invalid(e)),
    };
    let pool = core.db.reader();
    if is_full_uuid(&s) {
        return Ok(match agents::get(pool, &s).await? {
            Some(a) if a.user_name == user => Resolved::Ok(Box::new(a)),
            _ => Resolved::None(open_handles(core, user).await?),
        });
    }
    let ids = agents::open_with_prefix_ro(pool, user, &s, 11).await?;
    match ids.len() {
        0 => Ok(Resolved::None(open_handles(core, user).await?)),
        1 => Ok(match agents::get(pool, &ids[0]).await? {
            Some(a) => Resolved::Ok(Box::new(a)),
            None => Resolved::None(Vec::new()),
        }),
        _ => {
            let mut hs = Vec::with_capacity(ids.len());
            for id in &ids {
                hs.push(agents::handle(pool, user, id).await?);
            }
            Ok(Resolved::Ambiguous(hs))
        }
    }
}

async fn open_handles(core: &Core, user: &str) -> Result<Vec<String>, DbError> {
    let pool = core.db.reader();
    let mut out = Vec::new();
    for id in agents::open_ids_ro(pool, user, 10).await? {
        out.push(agents::handle(pool, user, &id).await?);
    }
    Ok(out)
}

/// The message for a reference that did not resolve to one agent.
pub fn describe_failure(r: &str, res: &Resolved) -> String {
    match res {
        Resolved::Ok(_) => String::new(),
        Resolved::Invalid(e) => format!("`{r}` is not an agent reference: {e}"),
        Resolved::None(open) if open.is_empty() => {
            format!("no agent matches `{r}` (you have no open agents)")
        }
        Resolved::None(open) => format!("no agent matches `{r}`; open agents: {}", open.join(", ")),
        Resolved::Ambiguous(hs) => format!(
            "`{r}` matches several agents: {}; add one more character",
            hs.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_is_one_past_the_longest_shared_prefix() {
        let id = "abcdef12-0000-4000-8000-000000000000";
        assert_eq!(from_neighbours(id, None, None), "abcd");
        assert_eq!(
            from_neighbours(id, Some("abcdef00-1111-4000-8000-000000000000"), None),
            "abcdef1"
        );
        assert_eq!(
            from_neighbours(
                id,
                Some("ab000000-0000-4000-8000-000000000000"),
                Some("abcdef12-0")
            ),
            "abcdef12-0000-4000-8000-000000000000"[..11].to_string()
        );
    }

    #[test]
    fn sanitize_rejects_wildcards_and_non_hex() {
        assert_eq!(sanitize("ABCD"), Ok("abcd".into()));
        assert_eq!(sanitize("ab%d"), Err(RefError::BadCharacter('%')));
        assert_eq!(sanitize("ab_d"), Err(RefError::BadCharacter('_')));
        assert_eq!(sanitize("ab'd"), Err(RefError::BadCharacter('\'')));
        assert_eq!(sanitize("zzzz"), Err(RefError::BadCharacter('z')));
        assert_eq!(sanitize("abc"), Err(RefError::TooShort));
        assert_eq!(range_end("abcd"), "abcdg");
    }
}
