//! Tools: the `Tool` trait, the catalog whose advertised schemas and handlers
//! come from one registration, the one place that narrows a tool set
//! (definition ∩ parent ∩ allow \ deny, minus what the level forbids), and
//! argument validation against each tool's JSON schema.

pub mod agents;
pub mod debug;
pub mod messaging;
pub mod schema;
pub mod todo;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::core::Core;
use crate::db::agents::AgentRow;
use crate::definitions::Permissions;
use crate::model::types::ToolSpec;

/// What a tool call produced.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutput {
    /// A result for the model.
    Ok(String),
    /// An error for the model to act on; the loop goes on.
    Err(String),
    /// The result is written later by whatever the call waits on (a
    /// foreground child, a wait); the agent suspends.
    Pending,
    /// The call waits for a human's approval before it runs; the agent
    /// suspends and the resumed turn runs the call once approved.
    AwaitingApproval,
}

/// Everything a tool call may use.
pub struct ToolCtx<'a> {
    pub core: &'a Arc<Core>,
    pub agent: &'a AgentRow,
    /// The tool-call id: also the idempotency key of side effects.
    pub call_id: &'a str,
    pub cancel: &'a CancellationToken,
    /// Tool calls since the agent last wrote its todo list.
    pub todo_calls_since: usize,
}

/// One tool.
#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    /// Name, description and parameter schema, as advertised.
    fn spec(&self) -> ToolSpec;

    /// Whether several calls may run at once with other tools.
    fn parallel(&self) -> bool {
        true
    }

    /// Tools that create or wait on agents or background work; an agent at
    /// the maximum level never gets them.
    fn spawns(&self) -> bool {
        false
    }

    /// The definition permission this tool needs (`send_to_agent`,
    /// `read_agent`); without it the tool is never offered.
    fn permission(&self) -> Option<Permission> {
        None
    }

    /// Runs the call with validated arguments.
    async fn call(&self, ctx: &ToolCtx<'_>, args: Value) -> ToolOutput;
}

/// The registered tools.
pub struct Catalog {
    tools: BTreeMap<String, (Arc<dyn Tool>, ToolSpec)>,
}

impl Catalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self {
            tools: BTreeMap::new(),
        }
    }

    /// Registers a tool under its spec's name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        let spec = tool.spec();
        self.tools.insert(spec.name.clone(), (tool, spec));
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|(t, _)| t)
    }

    /// The spec of `name`.
    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name).map(|(_, s)| s)
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// Every registered name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// The specs of `names`, in that order, skipping unknown ones.
    pub fn specs(&self, names: &[String]) -> Vec<ToolSpec> {
        names.iter().filter_map(|n| self.spec(n).cloned()).collect()
    }

    /// The one place that narrows a tool set. `offered` is the definition's
    /// list; the result keeps only tools that are registered, the parent has
    /// (when there is a parent), the allow list names (when given), the deny
    /// list does not name, and the level permits. Returns the effective set
    /// (in `offered` order) and the requested tools that were dropped
    /// because the parent lacks them.
    pub fn narrow(&self, n: Narrowing<'_>) -> (Vec<String>, Vec<String>) {
        let at_max_level = n.level >= n.max_level;
        let mut effective = Vec::new();
        for name in n.offered {
            if !self.contains(name) || effective.contains(name) {
                continue;
            }
            if let Some(parent) = n.parent {
                if !parent.contains(name) {
                    continue;
                }
            }
            if let Some(allow) = n.allow {
                if !allow.contains(name) {
                    continue;
                }
            }
            if n.deny.contains(name) {
                continue;
            }
            let Some(tool) = self.get(name) else {
                continue;
            };
            if at_max_level && tool.spawns() {
                continue;
            }
            if let Some(p) = tool.permission() {
                if !p.granted_by(n.permissions) {
                    continue;
                }
            }
            effective.push(name.clone());
        }
        let dropped = match (n.allow, n.parent) {
            (Some(allow), Some(parent)) => allow
                .iter()
                .filter(|a| !parent.contains(a))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        (effective, dropped)
    }
}

impl Default for Catalog {
    fn default() -> Self {
        Self::new()
    }
}

/// A definition permission a tool may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    SendToAgent,
    ReadAgent,
}

impl Permission {
    /// Whether the definition's permissions include this one.
    pub fn granted_by(self, p: &Permissions) -> bool {
        match self {
            Self::SendToAgent => p.send_to_agent,
            Self::ReadAgent => p.read_agent,
        }
    }
}

/// The inputs of `Catalog::narrow`.
pub struct Narrowing<'a> {
    pub permissions: &'a Permissions,
    pub offered: &'a [String],
    pub parent: Option<&'a [String]>,
    pub allow: Option<&'a [String]>,
    pub deny: &'a [String],
    pub level: i64,
    pub max_level: i64,
}

/// The built-in tools this configuration enables.
pub fn builtin_catalog(cfg: &crate::config::Config) -> Catalog {
    let mut c = Catalog::new();
    c.register(Arc::new(agents::SpawnAgent));
    c.register(Arc::new(agents::WaitForAgent));
    c.register(Arc::new(agents::AgentStatusTool));
    c.register(Arc::new(agents::AgentList));
    c.register(Arc::new(agents::AgentCancel));
    c.register(Arc::new(agents::CloseAgent));
    c.register(Arc::new(messaging::SendToAgent));
    c.register(Arc::new(messaging::ReadAgent));
    c.register(Arc::new(todo::TodoWrite));
    c.register(Arc::new(todo::TodoRead));
    if cfg.tools.debug {
        c.register(Arc::new(debug::Echo));
        c.register(Arc::new(debug::Sleep));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str, bool);

    #[async_trait::async_trait]
    impl Tool for Named {
        fn spec(&self) -> ToolSpec {
            ToolSpec {
                name: self.0.into(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            }
        }
        fn spawns(&self) -> bool {
            self.1
        }
        async fn call(&self, _: &ToolCtx<'_>, _: Value) -> ToolOutput {
            ToolOutput::Ok(String::new())
        }
    }

    fn catalog() -> Catalog {
        let mut c = Catalog::new();
        for (n, s) in [("a", false), ("b", false), ("c", false), ("spawn", true)] {
            c.register(Arc::new(Named(n, s)));
        }
        c
    }

    fn v(x: &[&str]) -> Vec<String> {
        x.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn narrowing_is_an_intersection_minus_deny() {
        let c = catalog();
        let offered = v(&["a", "b", "c", "spawn", "unknown"]);
        let parent = v(&["a", "b", "spawn"]);
        let allow = v(&["a", "b", "c"]);
        let deny = v(&["b"]);
        let (eff, dropped) = c.narrow(Narrowing {
            permissions: &Permissions::default(),
            offered: &offered,
            parent: Some(&parent),
            allow: Some(&allow),
            deny: &deny,
            level: 2,
            max_level: 3,
        });
        assert_eq!(eff, v(&["a"]));
        assert_eq!(dropped, v(&["c"]));
    }

    #[test]
    fn max_level_loses_spawning_tools() {
        let c = catalog();
        let offered = v(&["a", "spawn"]);
        let (eff, _) = c.narrow(Narrowing {
            permissions: &Permissions::default(),
            offered: &offered,
            parent: None,
            allow: None,
            deny: &[],
            level: 3,
            max_level: 3,
        });
        assert_eq!(eff, v(&["a"]));
        let (eff, _) = c.narrow(Narrowing {
            permissions: &Permissions::default(),
            offered: &offered,
            parent: None,
            allow: None,
            deny: &[],
            level: 2,
            max_level: 3,
        });
        assert_eq!(eff, v(&["a", "spawn"]));
    }
}
