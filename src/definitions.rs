//! Agent definitions (`config/agents/<slug>.toml`, SPEC §8): templates with a
//! role, a tool list, prompts, limits and permissions. Loaded once at
//! start-up; a bad file stops start-up with file, key and problem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::{Config, ConfigError};
use crate::tools::Catalog;

/// What a definition allows beyond its tools.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Permissions {
    pub send_to_agent: bool,
    pub read_agent: bool,
    pub top_level: bool,
}

/// One agent template.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    pub slug: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub is_subagent: bool,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub system_prompt: String,
    #[serde(default)]
    pub subagent_system_prompt: Option<String>,
    #[serde(default)]
    pub max_turns: Option<i64>,
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    #[serde(default)]
    pub timeout_s: Option<f64>,
    #[serde(default)]
    pub working_directory: Option<PathBuf>,
    #[serde(default)]
    pub permissions: Permissions,
}

impl Definition {
    /// The role whose model chain serves this definition.
    pub fn role(&self) -> &str {
        self.role.as_deref().unwrap_or("default")
    }
}

/// Every loaded definition by slug.
#[derive(Debug, Clone, Default)]
pub struct Definitions {
    by_slug: BTreeMap<String, Definition>,
}

/// Tools a definition may name even when this configuration disables them
/// (they are then simply not offered).
const OPTIONAL_TOOLS: &[&str] = &["echo", "sleep"];

impl Definitions {
    /// Loads `*.toml` from the configured directory and validates each
    /// against the roles and the tool catalog.
    pub fn load(cfg: &Config, catalog: &Catalog) -> Result<Self, ConfigError> {
        let dir = &cfg.agents.definitions_dir;
        let entries = std::fs::read_dir(dir).map_err(|e| {
            ConfigError::new(
                &cfg.source,
                "agents.definitions_dir",
                format!("cannot read {}: {e}", dir.display()),
            )
        })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        paths.sort();
        let mut by_slug = BTreeMap::new();
        for path in paths {
            let def = Self::load_file(&path, cfg, catalog)?;
            by_slug.insert(def.slug.clone(), def);
        }
        if !by_slug.contains_key("default") {
            return Err(ConfigError::new(
                dir.display().to_string(),
                "default.toml",
                "no `default` definition: submissions that name none need it",
            ));
        }
        Ok(Self { by_slug })
    }

    fn load_file(path: &Path, cfg: &Config, catalog: &Catalog) -> Result<Definition, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(&file, "-", format!("cannot read: {e}")))?;
        let value: toml::Value = text
            .parse::<toml::Table>()
            .map(toml::Value::Table)
            .map_err(|e| ConfigError::new(&file, "-", format!("not valid TOML: {e}")))?;
        let def: Definition = serde_path_to_error::deserialize(value).map_err(|e| {
            ConfigError::new(&file, e.path().to_string(), e.into_inner().to_string())
        })?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if def.slug != stem {
            return Err(ConfigError::new(
                &file,
                "slug",
                format!("`{}` must match the file name `{stem}`", def.slug),
            ));
        }
        if def.slug.is_empty()
            || !def
                .slug
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(ConfigError::new(
                &file,
                "slug",
                "use lowercase letters, digits, - and _",
            ));
        }
        if !cfg.roles.contains_key(def.role()) {
            return Err(ConfigError::new(
                &file,
                "role",
                format!(
                    "unknown role `{}` (configured: {})",
                    def.role(),
                    cfg.roles.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        for (i, t) in def.tools.iter().enumerate() {
            if !catalog.contains(t) && !OPTIONAL_TOOLS.contains(&t.as_str()) {
                return Err(ConfigError::new(
                    &file,
                    format!("tools[{i}]"),
                    format!("unknown tool `{t}` (known: {})", catalog.names().join(", ")),
                ));
            }
        }
        if let Some(n) = def.max_turns {
            if n < 1 {
                return Err(ConfigError::new(&file, "max_turns", "must be at least 1"));
            }
        }
        if let Some(c) = def.max_cost_usd {
            if c.is_nan() || c <= 0.0 {
                return Err(ConfigError::new(&file, "max_cost_usd", "must be positive"));
            }
        }
        if let Some(t) = def.timeout_s {
            if t.is_nan() || t <= 0.0 {
                return Err(ConfigError::new(&file, "timeout_s", "must be positive"));
            }
        }
        Ok(def)
    }

    /// The definition `slug`.
    pub fn get(&self, slug: &str) -> Option<&Definition> {
        self.by_slug.get(slug)
    }

    /// Every slug, sorted.
    pub fn slugs(&self) -> Vec<String> {
        self.by_slug.keys().cloned().collect()
    }
}
