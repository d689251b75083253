//! The fleet's side of a rollout: each sampler call sent to the least busy server that is up,
//! sent again elsewhere when that server fails, and recorded in the run's timeline.

use super::{Fleet, RETRY, lock};
use crate::events::{Event, EventKind};
use rlft_rollout::{Generated, Generator, RolloutError, SamplingConfig};
use std::sync::PoisonError;
use std::time::Instant;

/// Sends a rollout's sampler calls to the fleet (see [`Fleet::generator`]).
pub struct FleetGenerator<'f> {
    pub(super) fleet: &'f Fleet,
    pub(super) version: u64,
    pub(super) batch: u64,
    pub(super) round: usize,
}

impl Generator for FleetGenerator<'_> {
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        groups: &[usize],
        cfg: &SamplingConfig,
    ) -> std::result::Result<Generated, RolloutError> {
        let fleet = self.fleet;
        let call = Call {
            batch: self.batch,
            round: self.round,
            groups,
        };
        // When every server went down: since when.
        let mut all_down: Option<Instant> = None;
        // However the servers fail, a call gives up once each could have had a full try.
        let started = Instant::now();
        let patience = fleet.timeout * (fleet.len() as u32 + 1);
        loop {
            let Some((k, client, busy)) = fleet.pick() else {
                let since = *all_down.get_or_insert_with(Instant::now);
                if fleet.revive() {
                    continue;
                }
                if since.elapsed() >= fleet.timeout {
                    return Err(RolloutError::Server(format!(
                        "no server answered for {:.0} s ({}); the run stops, and --resume \
                         continues it once servers answer",
                        fleet.timeout.as_secs_f64(),
                        fleet.names()
                    )));
                }
                std::thread::sleep(RETRY);
                continue;
            };
            all_down = None;
            let t0 = Instant::now();
            let answer = client.generate(prompts, cfg, self.version);
            drop(busy);
            let span = (t0, Instant::now());
            let remote = match answer {
                Ok(r) => r,
                Err(e) if e.is_server_fault() => {
                    let why = e.to_string();
                    fleet.record(
                        (k, client.url()),
                        span,
                        &call,
                        Answered {
                            version: self.version,
                            tokens: 0,
                            outcome: format!("requeued: {why}"),
                        },
                    );
                    lock(&fleet.stats).requeued += 1;
                    fleet.down(k, &why);
                    if started.elapsed() >= patience {
                        return Err(RolloutError::Server(format!(
                            "no server answered this request in {:.0} s, the last one: {why}; \
                             the run stops, and --resume continues it once servers answer",
                            started.elapsed().as_secs_f64()
                        )));
                    }
                    continue;
                }
                Err(e) => return Err(RolloutError::Server(e.to_string())),
            };
            let tokens: usize = remote.completions.iter().map(|c| c.tokens.len()).sum();
            let newest = remote.versions.iter().flatten().max().copied();
            if let Some(newest) = newest {
                self.version = self.version.max(newest);
            }
            fleet.record(
                (k, client.url()),
                span,
                &call,
                Answered {
                    version: newest.unwrap_or(self.version),
                    tokens,
                    outcome: "ok".into(),
                },
            );
            let mut st = lock(&fleet.stats);
            st.requests += 1;
            st.request_secs += (span.1 - span.0).as_secs_f64();
            st.tokens += tokens;
            return Ok(Generated {
                completions: remote.completions,
                versions: remote.versions,
            });
        }
    }

    fn version(&self) -> u64 {
        self.version
    }
}

/// One sampler call, for the records.
struct Call<'c> {
    batch: u64,
    round: usize,
    groups: &'c [usize],
}

/// How a request ended, for the timeline.
struct Answered {
    /// The newest weight version among its tokens (the call's, when none came back).
    version: u64,
    /// Tokens it brought back.
    tokens: usize,
    /// `ok`, or `requeued: why`.
    outcome: String,
}

impl Fleet {
    /// Records a request to server `k` at `url` in the timeline.
    fn record(&self, (k, url): (usize, &str), span: (Instant, Instant), call: &Call, a: Answered) {
        let Answered {
            version,
            tokens,
            outcome,
        } = a;
        let Some(t) = self
            .timeline
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            return;
        };
        let now = t.now();
        let at = |i: Instant| now - i.elapsed().as_secs_f64();
        let mut groups = vec![call.round];
        for &g in call.groups {
            if !groups[1..].contains(&g) {
                groups.push(g);
            }
        }
        t.push(Event {
            actor: format!("server/{k}"),
            kind: EventKind::Request,
            start_s: at(span.0),
            end_s: at(span.1),
            version,
            tokens,
            batch: Some(call.batch),
            groups: Some(groups),
            server: Some(url.to_string()),
            outcome: Some(outcome),
        });
    }
}
