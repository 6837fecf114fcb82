//! The scheduler (SPEC §10). Schedules are rows; the `schedules` table is
//! the source of truth for what fires when (`next_fire_at`), and
//! tokio-cron-scheduler drives the timing: one cron job per enabled
//! schedule wakes this service at each tick. A fire is one transaction: the
//! fire record (unique per schedule and occurrence — the dedupe key), the
//! agent it creates (brief) or the message it delivers (heartbeat), and the
//! advanced `next_fire_at`. After downtime the latest missed occurrence
//! fires once if it is within `[scheduler] catch_up_s`, else it is recorded
//! as missed.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds};
use croner::Cron;
use serde_json::json;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;

use crate::clock::{ms_to_datetime, rfc3339};
use crate::core::Core;
use crate::creation::{self, NewAgentRequest};
use crate::db::agents;
use crate::db::schedules::{self, ScheduleRow};
use crate::db::{events, DbResult, WriteCtx, WriteFuture};
use crate::delivery::{self, DeliverError, Message};
use crate::events::{Event, EventKind};
use crate::types::Origin;

/// A parsed cron expression with its timezone.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: Cron,
    tz: Option<Tz>,
}

/// Why a schedule's cron or timezone was refused, and which of the two.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CronError {
    /// `cron` or `timezone`.
    pub field: &'static str,
    pub message: String,
}

impl CronError {
    fn cron(message: String) -> Self {
        Self {
            field: "cron",
            message,
        }
    }
}

impl CronSpec {
    /// Parses 5-field (minute first) or 6-field (second first) expressions
    /// and an optional IANA timezone; errors say what is wrong.
    pub fn parse(expr: &str, timezone: Option<&str>) -> Result<Self, CronError> {
        let fields = expr.split_whitespace().count();
        if fields != 5 && fields != 6 {
            return Err(CronError::cron(format!(
                "`{expr}` has {fields} fields; use 5 (minute hour day-of-month month day-of-week) or 6 (with seconds first)"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(expr)
            .map_err(|e| {
                CronError::cron(format!("`{expr}` is not a valid cron expression: {e}"))
            })?;
        let tz = match timezone.map(str::trim).filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => Some(Tz::from_str(t).map_err(|_| CronError {
                field: "timezone",
                message: format!("unknown timezone `{t}` (use an IANA name like Europe/Berlin)"),
            })?),
        };
        Ok(Self { cron, tz })
    }

    /// The expression with seconds (tokio-cron-scheduler wants six fields).
    pub fn six_fields(expr: &str) -> String {
        if expr.split_whitespace().count() == 5 {
            format!("0 {expr}")
        } else {
            expr.to_string()
        }
    }

    fn at(&self, ms: i64) -> DateTime<Tz> {
        self.tz
            .unwrap_or(Tz::UTC)
            .from_utc_datetime(&ms_to_datetime(ms).naive_utc())
    }

    /// The first occurrence strictly after `ms` (occurrences fall on whole
    /// seconds).
    pub fn next_after(&self, ms: i64) -> Option<i64> {
        let floor = ms - ms.rem_euclid(1000);
        self.cron
            .find_next_occurrence(&self.at(floor), false)
            .ok()
            .map(|t| whole_second(t.with_timezone(&Utc).timestamp_millis()))
    }

    /// The latest occurrence at or before `ms`.
    pub fn latest_at_or_before(&self, ms: i64) -> Option<i64> {
        // Occurrences are on whole seconds.
        let floor = ms - ms.rem_euclid(1000);
        self.cron
            .find_previous_occurrence(&self.at(floor), true)
            .ok()
            .map(|t| whole_second(t.with_timezone(&Utc).timestamp_millis()))
    }
}

fn whole_second(ms: i64) -> i64 {
    ms - ms.rem_euclid(1000)
}

/// How one occurrence was handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// Handled before (the dedupe key held).
    AlreadyFired,
    /// An agent was created or a message delivered.
    Fired { agent_id: String },
    /// Skipped (`overlap = "skip"` and the previous fire's agent is busy).
    Skipped(String),
    /// The fire could not create or deliver (the reason is recorded).
    Failed(String),
}

fn schedule_event(
    kind: EventKind,
    s: &ScheduleRow,
    agent: Option<&agents::AgentRow>,
    at: i64,
    data: serde_json::Value,
) -> Event {
    Event {
        kind,
        agent_id: agent.map(|a| a.id.clone()),
        user: s.user_name.clone(),
        level: agent.map(|a| a.level),
        parent_id: agent.and_then(|a| a.parent_id.clone()),
        root_id: agent.map(|a| a.root_id.clone()),
        at,
        data,
    }
}

/// Fires one occurrence inside a write: the fire record, then the agent or
/// message. `manual` fires (run now) ignore the overlap rule.
pub async fn fire_tx(
    ctx: &mut WriteCtx,
    core: &Core,
    s: &ScheduleRow,
    fire_at: i64,
    manual: bool,
) -> DbResult<Fired> {
    if !schedules::claim_fire(&mut ctx.conn, ctx.now, &s.id, fire_at, "fired").await? {
        return Ok(Fired::AlreadyFired);
    }
    if !manual && s.overlap == "skip" {
        if let Some(prev) = s.last_agent_id.as_deref() {
            if let Some(a) = agents::get_tx(&mut ctx.conn, prev).await? {
                if a.status.is_active() {
                    let why = format!("the previous fire's agent {} is still {}", a.id, a.status);
                    schedules::record_fire(
                        &mut ctx.conn,
                        &s.id,
                        fire_at,
                        "skipped",
                        Some(&a.id),
                        Some(&why),
                    )
                    .await?;
                    return Ok(Fired::Skipped(why));
                }
            }
        }
    }
    let outcome = match s.kind.as_str() {
        "brief" => {
            let mut req = NewAgentRequest::top_level(&s.user_name, s.task.as_deref().unwrap_or(""));
            req.definition = s.agent.clone();
            req.notify = s
                .notify
                .as_deref()
                .and_then(|n| serde_json::from_str(n).ok());
            req.origin = Origin::Cron;
            req.sender = Some(s.id.clone());
            req.metadata =
                json!({"schedule_id": s.id, "schedule": s.name, "fire_at": rfc3339(fire_at)});
            match creation::create_top_level_tx(ctx, core, req).await {
                Ok(c) => Ok(c.agent),
                Err(creation::CreateError::Db(e)) => return Err(e),
                Err(e) => Err(e.to_string()),
            }
        }
        _ => {
            let m = Message {
                target: s.target.clone().unwrap_or_default(),
                content: s
                    .task
                    .clone()
                    .unwrap_or_else(|| core.cfg.heartbeat.prompt.clone()),
                origin: Origin::Heartbeat,
                sender: Some(s.id.clone()),
                interrupt: false,
            };
            match delivery::deliver_tx(ctx, core, &m).await {
                Ok(d) => agents::get_tx(&mut ctx.conn, &d.target.id)
                    .await?
                    .ok_or_else(|| "the target vanished".to_string()),
                Err(DeliverError::Db(e)) => return Err(e),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    match outcome {
        Ok(agent) => {
            schedules::record_fire(
                &mut ctx.conn,
                &s.id,
                fire_at,
                "fired",
                Some(&agent.id),
                None,
            )
            .await?;
            schedules::advance(
                &mut ctx.conn,
                &s.id,
                Some(fire_at),
                s.next_fire_at,
                Some(&agent.id),
            )
            .await?;
            let ev = schedule_event(
                EventKind::ScheduleFired,
                s,
                Some(&agent),
                ctx.now,
                json!({"schedule_id": s.id, "name": s.name, "kind": s.kind, "fire_at": rfc3339(fire_at)}),
            );
            events::emit(ctx, ev).await?;
            Ok(Fired::Fired { agent_id: agent.id })
        }
        Err(why) => {
            schedules::record_fire(&mut ctx.conn, &s.id, fire_at, "failed", None, Some(&why))
                .await?;
            Ok(Fired::Failed(why))
        }
    }
}

/// Handles a due schedule: fires its latest occurrence (once, however many
/// were missed); then moves `next_fire_at` past now. On the first pass after
/// start (`after_downtime`), an occurrence older than `[scheduler]
/// catch_up_s` is recorded as missed instead. One transaction.
async fn handle_due(core: &Arc<Core>, id: String, after_downtime: bool) -> DbResult<()> {
    let core2 = Arc::clone(core);
    core.db
        .write(move |ctx: &mut WriteCtx| -> WriteFuture<'_, ()> {
            Box::pin(async move {
                let Some(s) = schedules::get_tx(&mut ctx.conn, &id).await? else {
                    return Ok(());
                };
                let Some(next) = s.next_fire_at.filter(|t| *t <= ctx.now && s.enabled) else {
                    return Ok(());
                };
                let spec = match CronSpec::parse(&s.cron, s.timezone.as_deref()) {
                    Ok(spec) => spec,
                    Err(e) => {
                        tracing::error!(schedule_id = %s.id, error = %e, "stored schedule has a bad cron; disabling");
                        schedules::advance(&mut ctx.conn, &s.id, None, None, None).await?;
                        return Ok(());
                    }
                };
                let latest = spec.latest_at_or_before(ctx.now).unwrap_or(next).max(next);
                let window = core2.cfg.scheduler.catch_up_s.max(0) * 1000;
                if !after_downtime || ctx.now - latest <= window {
                    let fired = fire_tx(ctx, &core2, &s, latest, false).await?;
                    tracing::info!(schedule_id = %s.id, fire_at = %rfc3339(latest), ?fired, "schedule fired");
                } else if schedules::claim_fire(&mut ctx.conn, ctx.now, &s.id, latest, "missed").await? {
                    let ev = schedule_event(
                        EventKind::ScheduleMissed,
                        &s,
                        None,
                        ctx.now,
                        json!({"schedule_id": s.id, "name": s.name, "fire_at": rfc3339(latest),
                               "catch_up_s": core2.cfg.scheduler.catch_up_s}),
                    );
                    events::emit(ctx, ev).await?;
                    tracing::warn!(schedule_id = %s.id, fire_at = %rfc3339(latest), "missed fire outside catch_up_s");
                }
                schedules::advance(&mut ctx.conn, &s.id, None, spec.next_after(ctx.now), None).await?;
                Ok(())
            })
        })
        .await
}

/// Fires everything due now (`after_downtime` on the first pass after start).
pub async fn fire_due(core: &Arc<Core>, after_downtime: bool) -> DbResult<usize> {
    let due = schedules::due(core.db.reader(), core.now_ms()).await?;
    let n = due.len();
    for id in due {
        handle_due(core, id, after_downtime).await?;
    }
    Ok(n)
}

/// Keeps one tokio-cron-scheduler job per enabled schedule; each tick wakes
/// the service.
struct Ticks {
    sched: JobScheduler,
    jobs: HashMap<String, (uuid::Uuid, String)>,
}

impl Ticks {
    async fn sync(&mut self, core: &Arc<Core>, rows: &[ScheduleRow]) {
        let wanted: HashMap<&str, String> = rows
            .iter()
            .map(|s| {
                (
                    s.id.as_str(),
                    format!("{}|{}", s.cron, s.timezone.as_deref().unwrap_or("")),
                )
            })
            .collect();
        let stale: Vec<String> = self
            .jobs
            .iter()
            .filter(|(id, (_, key))| wanted.get(id.as_str()) != Some(key))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if let Some((job, _)) = self.jobs.remove(&id) {
                let _ = self.sched.remove(&job).await;
            }
        }
        for s in rows {
            if self.jobs.contains_key(&s.id) {
                continue;
            }
            let expr = CronSpec::six_fields(&s.cron);
            let tz = s
                .timezone
                .as_deref()
                .and_then(|t| Tz::from_str(t).ok())
                .unwrap_or(Tz::UTC);
            let c = Arc::clone(core);
            let job = Job::new_async_tz(expr.as_str(), tz, move |_id, _lock| {
                let c = Arc::clone(&c);
                Box::pin(async move { c.signals.schedules.notify_one() })
            });
            match job {
                Ok(job) => match self.sched.add(job).await {
                    Ok(uuid) => {
                        self.jobs
                            .insert(s.id.clone(), (uuid, wanted[s.id.as_str()].clone()));
                    }
                    Err(e) => {
                        tracing::warn!(schedule_id = %s.id, error = %e, "cannot add the cron job; polling covers it")
                    }
                },
                Err(e) => {
                    tracing::warn!(schedule_id = %s.id, error = %e, "cron job rejected; polling covers it")
                }
            }
        }
    }
}

/// The scheduler service.
pub async fn run(core: Arc<Core>, stop: CancellationToken) {
    let mut ticks = match JobScheduler::new().await {
        Ok(sched) => {
            if let Err(e) = sched.start().await {
                tracing::warn!(error = %e, "cannot start tokio-cron-scheduler; polling only");
            }
            Some(Ticks {
                sched,
                jobs: HashMap::new(),
            })
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot create tokio-cron-scheduler; polling only");
            None
        }
    };
    let mut first_pass = true;
    loop {
        match schedules::enabled(core.db.reader()).await {
            Ok(rows) => {
                if let Some(t) = ticks.as_mut() {
                    t.sync(&core, &rows).await;
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot read schedules"),
        }
        match fire_due(&core, first_pass).await {
            Ok(_) => first_pass = false,
            Err(e) => tracing::error!(error = %e, "scheduler pass failed"),
        }
        // Ticks and changes wake us; the table's next fire bounds the wait
        // (a tick that arrives a moment early would otherwise be lost).
        let wait = match schedules::next_due(core.db.reader()).await {
            Ok(Some(t)) => (t - core.now_ms()).clamp(0, 1000),
            _ => 1000,
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = core.signals.schedules.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(wait as u64)) => {}
        }
    }
    if let Some(mut t) = ticks {
        let _ = t.sched.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis()
    }

    #[test]
    fn five_and_six_fields() {
        let five = CronSpec::parse("*/15 * * * *", None).unwrap();
        assert_eq!(
            five.next_after(ms("2026-01-01T10:07:00Z")),
            Some(ms("2026-01-01T10:15:00Z"))
        );
        let six = CronSpec::parse("*/2 * * * * *", None).unwrap();
        assert_eq!(
            six.next_after(ms("2026-01-01T10:00:00.500Z")),
            Some(ms("2026-01-01T10:00:02Z"))
        );
        assert_eq!(
            six.latest_at_or_before(ms("2026-01-01T10:00:03.500Z")),
            Some(ms("2026-01-01T10:00:02Z"))
        );
        assert_eq!(CronSpec::six_fields("0 9 * * *"), "0 0 9 * * *");
    }

    #[test]
    fn timezones_shift_occurrences() {
        let berlin = CronSpec::parse("0 9 * * *", Some("Europe/Berlin")).unwrap();
        // 09:00 in Berlin in winter is 08:00 UTC.
        assert_eq!(
            berlin.next_after(ms("2026-01-05T00:00:00Z")),
            Some(ms("2026-01-05T08:00:00Z"))
        );
    }

    #[test]
    fn bad_input_says_what_is_wrong() {
        let e = CronSpec::parse("* * *", None).unwrap_err();
        assert!(e.message.contains("has 3 fields"));
        assert_eq!(e.field, "cron");
        let e = CronSpec::parse("61 * * * *", None).unwrap_err();
        assert!(e.message.contains("not a valid cron"));
        assert_eq!(e.field, "cron");
        let e = CronSpec::parse("* * * * *", Some("Mars/Olympus")).unwrap_err();
        assert!(e.message.contains("unknown timezone"));
        assert_eq!(e.field, "timezone");
    }
}
