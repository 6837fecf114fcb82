//! `agentq bench`: the workloads of BENCH.md on a fresh temp database.

pub mod w2;

use std::path::Path;

use crate::config::Config;

/// A config for benchmarks: temp database, in-process mock, debug tools.
pub fn bench_config(dir: &Path, defs: &Path, overrides: &str) -> anyhow::Result<Config> {
    let text = format!(
        r#"
[server]
bind = "127.0.0.1:0"
[database]
path = "{db}"
[workers]
concurrency = 16
[agents]
definitions_dir = "{defs}"
max_active_agents_per_user = 1000000
[tools]
debug = true
[providers.mock]
kind = "mock"
max_concurrent = 100000
[models.mock]
provider = "mock"
model = "mock"
[roles]
default = ["mock"]
{overrides}
"#,
        db = dir.join("bench.db").display(),
        defs = defs.display(),
    );
    Ok(Config::parse(
        &text,
        "<bench>",
        Vec::<(String, String)>::new(),
    )?)
}

/// Writes the benchmark's agent definition and returns its directory.
pub fn write_definitions(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let defs = dir.join("agents");
    std::fs::create_dir_all(&defs)?;
    std::fs::write(
        defs.join("default.toml"),
        "slug = \"default\"\ntools = [\"echo\", \"sleep\"]\nsystem_prompt = \"bench\"\n",
    )?;
    Ok(defs)
}
