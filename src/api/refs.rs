//! Resolving `{ref}` path parameters and tool `agent` arguments: a full UUID
//! (also of closed agents) or a handle prefix among the caller's open agents
//! (SPEC §5). Other users' agents are never found.

use crate::core::Core;
use crate::db::agents::{self, AgentRow};
use crate::db::DbError;
use crate::handles;

/// How a reference resolved.
#[derive(Debug)]
pub enum Resolved {
    Ok(Box<AgentRow>),
    /// Nothing matches; the open handles of the user (up to 10).
    None(Vec<String>),
    /// Several match; their handles.
    Ambiguous(Vec<String>),
    /// Not a possible reference.
    Invalid(handles::RefError),
}

/// Resolves `r` for `user`.
pub async fn resolve(core: &Core, user: &str, r: &str) -> Result<Resolved, DbError> {
    let s = match handles::sanitize(r) {
        Ok(s) => s,
        Err(e) => return Ok(Resolved::Invalid(e)),
    };
    let pool = core.db.reader();
    if handles::is_full_uuid(&s) {
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
