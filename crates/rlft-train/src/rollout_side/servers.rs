//! Rollouts on inference servers (`rollout.servers`): the fleet of servers the rollout side
//! sends its sampler calls to, and the weight versions it brings them to.
//!
//! Each sampler call a rollout makes in-process goes to one server (the least busy) as one
//! completions request — the call's rows as token-id prompts in order, its settings and seed —
//! and the answer comes back as the completions the sampler would have returned, with the
//! version of every token ([`rlft_serve::Client::generate`]). New weights reach the servers
//! through the disk, as prime-rl and slime push them: the trainer writes version `k` to
//! `weights_dir/v<k>/` (a temporary folder, fsync, rename) and calls every server's
//! `/update_weights_from_disk`; versions no server serves any more are removed.
//!
//! `"local:N"` starts N servers inside the trainer's process (the code of `rlft serve`, each
//! on its own threads and a free loopback port) with the weights in memory when first asked
//! for a version; they stop when the fleet is dropped, with the run.
//!
//! Faults cost time, never data. A request a server does not answer (refused, cut, past
//! `rollout.server_timeout_s`, garbled, 429 or 5xx) is sent again — the same request, so the
//! same samples on the same weights — to another server, and the first is counted down
//! (`server/requeued`). A server that is down gets no work until it answers `/health` again
//! and has loaded the version the others serve. When no server answers for
//! `server_timeout_s` the run stops ([`TrainError::Servers`], exit status 4). Every request
//! is an event in `events.jsonl` with its batch, groups, server and outcome.

use crate::events::Timeline;
use crate::recipe::{Recipe, Servers};
use crate::{Result, TrainError};
use burn::module::Module;
use burn::tensor::Device;
use rlft_model::{Tokenizer, Transformer, TransformerConfig};
use rlft_serve::{Client, Policy, Server, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

mod generator;
pub use generator::FleetGenerator;

/// What the fleet did since the last report (`server/*` metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerStats {
    /// Completions requests answered.
    pub requests: usize,
    /// Seconds those requests took, summed over requests.
    pub request_secs: f64,
    /// Tokens the servers generated.
    pub tokens: usize,
    /// Seconds writing weights to `weights_dir`.
    pub write_secs: f64,
    /// Seconds the servers took to load them (every server's update route, side by side).
    pub load_secs: f64,
    /// Requests sent again to another server after theirs failed.
    pub requeued: usize,
}

/// One server, the requests it holds, and whether it may get work.
struct Member {
    client: Client,
    busy: AtomicUsize,
    /// Answering, and serving the fleet's version; a server that failed is down until it
    /// answers `/health` again and has loaded that version.
    up: AtomicBool,
}

/// What the weight pushes share: the version every server holds, and the local servers.
#[derive(Default)]
struct Versions {
    /// The version every server serves (`None`: not pushed yet).
    serving: Option<u64>,
    /// The servers of `"local:N"`, once started.
    local: Vec<Server>,
}

/// The servers a run samples on.
pub struct Fleet {
    spec: Servers,
    /// Set once: at construction for URLs, when the local servers start for `"local:N"`.
    members: RwLock<Vec<Member>>,
    versions: Mutex<Versions>,
    stats: Mutex<ServerStats>,
    weights_dir: PathBuf,
    timeout: Duration,
    /// What the local servers and the written folders need.
    tokenizer: Tokenizer,
    config: TransformerConfig,
    /// The local servers' device (`None`: the weights' own).
    device: Option<Device>,
    /// The local servers' limits.
    local_config: ServerConfig,
    /// Where requests are recorded (the run's timeline, once it is open).
    timeline: RwLock<Option<Arc<Timeline>>>,
    /// Where the next pick starts looking, so equally busy servers take turns.
    turn: AtomicUsize,
}

/// `lock` that takes over a poisoned mutex (a panicking thread left nothing half-written).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Fleet {
    /// The fleet `recipe.rollout.servers` names, for a run writing to `output_dir` with this
    /// tokenizer and architecture; `None` when rollouts stay in the process. Folders a former
    /// run left in `weights_dir` are removed (each version is written afresh).
    ///
    /// # Errors
    /// A `weights_dir` that cannot be created or cleared.
    pub fn new(
        recipe: &Recipe,
        tokenizer: &Tokenizer,
        config: &TransformerConfig,
    ) -> Result<Option<Self>> {
        let r = &recipe.rollout;
        if !r.servers.remote() {
            return Ok(None);
        }
        let weights_dir = r
            .weights_dir
            .clone()
            .unwrap_or_else(|| recipe.output_dir.join("weights"));
        std::fs::create_dir_all(&weights_dir).map_err(crate::io_err(&weights_dir))?;
        prune(&weights_dir, None)?;
        let timeout = Duration::from_secs_f64(r.server_timeout_s);
        let api_key = std::env::var("RLFT_API_KEY")
            .ok()
            .filter(|k| !k.trim().is_empty());
        let members = match &r.servers {
            Servers::Urls(urls) => urls
                .iter()
                .map(|u| {
                    member(
                        Client::new(u, &r.server_model, timeout)
                            .with_api_key(api_key.clone())
                            .with_protocol(r.server_protocol),
                    )
                })
                .collect(),
            _ => Vec::new(),
        };
        let device = match recipe.rollout.device {
            Some(d) => Some(d.device()?),
            None => None,
        };
        // The local servers take the calls this run makes and no larger ones.
        let rows = r.prompts_per_step.saturating_mul(r.group_size).max(1);
        let context = r.max_prompt_len.saturating_add(r.max_total_tokens);
        let local_config = ServerConfig::new()
            .with_port(0)
            .with_log_updates(false)
            .with_max_concurrent(recipe.asynchrony.rollout_workers.unwrap_or(1).max(1))
            .with_max_n(1)
            .with_max_rows(rows)
            .with_max_batch_tokens(rows.saturating_mul(context).max(1))
            .with_max_body_bytes(
                rows.saturating_mul(context)
                    .saturating_mul(16)
                    .max(64 << 20),
            );
        Ok(Some(Self {
            spec: r.servers.clone(),
            members: RwLock::new(members),
            versions: Mutex::new(Versions::default()),
            stats: Mutex::new(ServerStats::default()),
            weights_dir,
            timeout,
            tokenizer: tokenizer.clone(),
            config: config.clone(),
            device,
            local_config,
            timeline: RwLock::new(None),
            turn: AtomicUsize::new(0),
        }))
    }

    /// How many servers.
    pub fn len(&self) -> usize {
        self.spec.count()
    }

    /// Whether the fleet has no server (never: a fleet exists only with servers).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The version every server serves, once one was pushed.
    pub fn serving(&self) -> Option<u64> {
        lock(&self.versions).serving
    }

    /// How many servers are up.
    pub fn up(&self) -> usize {
        self.members
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|m| m.up.load(Ordering::Relaxed))
            .count()
    }

    /// The base URLs of the servers (the local ones once started).
    pub fn urls(&self) -> Vec<String> {
        self.members
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|m| m.client.url().to_string())
            .collect()
    }

    /// What the fleet did since the last call.
    pub fn take_stats(&self) -> ServerStats {
        std::mem::take(&mut *lock(&self.stats))
    }

    /// Brings every server to weight `version`, unless they serve it already: starts the
    /// local servers with `weights` the first time, else writes `weights` to
    /// `weights_dir/v<version>/` and has every server load it. One push at a time; requests
    /// in flight finish on the weights they started with.
    ///
    /// # Errors
    /// The folder cannot be written, a server cannot be reached or refuses the weights, or a
    /// local server cannot start.
    pub fn serve_version(&self, version: u64, weights: impl FnOnce() -> Transformer) -> Result<()> {
        let mut v = lock(&self.versions);
        if v.serving == Some(version) {
            return Ok(());
        }
        if let Servers::Local(n) = self.spec
            && v.local.is_empty()
        {
            let t0 = Instant::now();
            let model = weights();
            let model = match &self.device {
                Some(d) => model.to_device(d),
                None => model,
            };
            let policy = Policy {
                model,
                tokenizer: self.tokenizer.clone(),
                config: self.config.clone(),
                version,
            };
            // A key of this run's own: nothing else on the machine can swap their weights.
            let key = rlft_serve::guard::random_key()
                .map_err(|e| TrainError::Servers(format!("a local server cannot start: {e}")))?;
            let config = self.local_config.clone().with_api_key(Some(key.clone()));
            for _ in 0..n {
                let server = config.start(policy.clone()).map_err(|e| {
                    TrainError::Servers(format!("a local server cannot start: {e}"))
                })?;
                v.local.push(server);
            }
            *self.members.write().unwrap_or_else(PoisonError::into_inner) = v
                .local
                .iter()
                .map(|s| {
                    member(
                        Client::new(&s.url(), "policy", self.timeout)
                            .with_api_key(Some(key.clone())),
                    )
                })
                .collect();
            v.serving = Some(version);
            let mut st = lock(&self.stats);
            st.load_secs += t0.elapsed().as_secs_f64();
            return Ok(());
        }
        let t0 = Instant::now();
        let dir = self.write(version, weights())?;
        let t1 = Instant::now();
        // Every server that answers takes the version; one that does not is down until it
        // does. None answering for `server_timeout_s` stops the run.
        let members = self.members.read().unwrap_or_else(PoisonError::into_inner);
        let mut failures = push(&members, &dir, version, self.timeout);
        let since = Instant::now();
        while failures.len() == members.len() {
            if since.elapsed() >= self.timeout {
                return Err(TrainError::Servers(format!(
                    "no server took weight version {version} for {:.0} s ({}); check that every \
                     server runs the run's model and can read {}. The run stops; resume it with \
                     --resume once servers answer",
                    self.timeout.as_secs_f64(),
                    failures.join("; "),
                    self.weights_dir.display()
                )));
            }
            std::thread::sleep(RETRY);
            failures = push(&members, &dir, version, self.timeout);
        }
        drop(members);
        v.serving = Some(version);
        prune(&self.weights_dir, Some(version))?;
        let mut st = lock(&self.stats);
        st.write_secs += (t1 - t0).as_secs_f64();
        st.load_secs += t1.elapsed().as_secs_f64();
        Ok(())
    }

    /// Stops the `"local:N"` servers and removes the folders written for them (servers given by
    /// URL keep running and may still read theirs). The next version served starts them again.
    pub fn stop_local(&self) {
        if !matches!(self.spec, Servers::Local(_)) {
            return;
        }
        let v = std::mem::take(&mut *lock(&self.versions));
        self.members
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        drop(v.local);
        let _ = prune(&self.weights_dir, None);
        let _ = std::fs::remove_dir(&self.weights_dir);
    }

    /// Records requests in `timeline` from now on.
    pub fn set_timeline(&self, timeline: Arc<Timeline>) {
        *self
            .timeline
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(timeline);
    }

    /// Brings the servers that are down and answer `/health` again to the version the others
    /// serve; returns whether any came back.
    fn revive(&self) -> bool {
        let v = lock(&self.versions);
        let Some(version) = v.serving else {
            return false;
        };
        let dir = self.weights_dir.join(format!("v{version}"));
        let members = self.members.read().unwrap_or_else(PoisonError::into_inner);
        let mut back = false;
        for m in members.iter().filter(|m| !m.up.load(Ordering::Relaxed)) {
            // A version the local servers started with was never written: they cannot be
            // brought back (they live and die with this process).
            if dir.exists()
                && m.client.healthy(HEALTH_TIMEOUT.min(self.timeout))
                && m.client.update_weights(&dir, version).is_ok()
            {
                eprintln!(
                    "note: rollout server {} is back, serving version {version}",
                    m.client.url()
                );
                m.up.store(true, Ordering::Relaxed);
                back = true;
            }
        }
        back
    }

    /// Writes `weights` as `weights_dir/v<version>/`: into a temporary folder, each file
    /// fsynced, then renamed whole.
    fn write(&self, version: u64, weights: Transformer) -> Result<PathBuf> {
        let dir = self.weights_dir.join(format!("v{version}"));
        let tmp = self.weights_dir.join(format!(".v{version}.tmp"));
        for d in [&tmp, &dir] {
            if d.exists() {
                std::fs::remove_dir_all(d).map_err(crate::io_err(d))?;
            }
        }
        weights.save_hf(&self.config, Some(&self.tokenizer), &tmp)?;
        std::fs::rename(&tmp, &dir).map_err(crate::io_err(&dir))?;
        rlft_model::sync_dir(&self.weights_dir);
        Ok(dir)
    }

    /// A generator sending the calls of batch `batch`'s sampling round `round` to the fleet,
    /// starting at `version`.
    pub fn generator(&self, version: u64, batch: u64, round: usize) -> FleetGenerator<'_> {
        FleetGenerator {
            fleet: self,
            version,
            batch,
            round,
        }
    }

    /// The least busy server that is up (equals take turns), counted busy until the guard
    /// drops; `None` when every server is down.
    fn pick(&self) -> Option<(usize, Client, Busy<'_>)> {
        let members = self.members.read().unwrap_or_else(PoisonError::into_inner);
        let n = members.len();
        let start = self.turn.fetch_add(1, Ordering::Relaxed);
        let k = (0..n)
            .map(|i| (start + i) % n.max(1))
            .filter(|&k| members[k].up.load(Ordering::Relaxed))
            .min_by_key(|&k| members[k].busy.load(Ordering::Relaxed))?;
        members[k].busy.fetch_add(1, Ordering::Relaxed);
        Some((k, members[k].client.clone(), Busy { fleet: self, k }))
    }

    /// Counts server `k` down after `why`.
    fn down(&self, k: usize, why: &str) {
        let members = self.members.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = members.get(k)
            && m.up.swap(false, Ordering::Relaxed)
        {
            eprintln!("note: rollout server down, its requests go to the others: {why}");
        }
    }

    /// The servers' URLs, for messages.
    fn names(&self) -> String {
        self.urls().join(", ")
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_local();
    }
}

/// Marks one request on server `k` until dropped.
struct Busy<'f> {
    fleet: &'f Fleet,
    k: usize,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(m) = self
            .fleet
            .members
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(self.k)
        {
            m.busy.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn member(client: Client) -> Member {
    Member {
        client,
        busy: AtomicUsize::new(0),
        up: AtomicBool::new(true),
    }
}

/// How long a request waits between tries when every server is down.
const RETRY: Duration = Duration::from_millis(250);

/// The longest a down server may take to answer `/health`.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// Has every server that is up, or answers `/health` again, load `dir` as `version`, side by
/// side; marks each up or down by the outcome and returns the failures.
fn push(members: &[Member], dir: &Path, version: u64, timeout: Duration) -> Vec<String> {
    std::thread::scope(|s| {
        let pushes: Vec<_> = members
            .iter()
            .map(|m| {
                s.spawn(move || {
                    let was_up = m.up.load(Ordering::Relaxed);
                    if !was_up && !m.client.healthy(HEALTH_TIMEOUT.min(timeout)) {
                        return Err(format!("{}: does not answer /health", m.client.url()));
                    }
                    m.client
                        .update_weights(dir, version)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        pushes
            .into_iter()
            .zip(members)
            .filter_map(|(h, m)| {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err("the weight push panicked".into()));
                let was_up = m.up.swap(r.is_ok(), Ordering::Relaxed);
                match (was_up, &r) {
                    (true, Err(why)) => eprintln!(
                        "note: rollout server down, it gets no work until it is back: {why}"
                    ),
                    (false, Ok(())) => eprintln!(
                        "note: rollout server {} is back, serving version {version}",
                        m.client.url()
                    ),
                    _ => {}
                }
                r.err()
            })
            .collect()
    })
}

/// Removes the version folders (`v<k>`, and unfinished `.v<k>.tmp`) in `dir` but `keep`.
fn prune(dir: &Path, keep: Option<u64>) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(crate::io_err(dir)(e)),
    };
    for e in entries {
        let e = e.map_err(crate::io_err(dir))?;
        let name = e.file_name().to_string_lossy().to_string();
        let version = name
            .strip_prefix(".v")
            .and_then(|n| n.strip_suffix(".tmp"))
            .or_else(|| name.strip_prefix('v'))
            .and_then(|n| n.parse::<u64>().ok());
        let temporary = name.starts_with('.');
        if version.is_some_and(|v| temporary || Some(v) != keep) {
            let path = e.path();
            std::fs::remove_dir_all(&path).map_err(crate::io_err(&path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_removes_other_versions_and_unfinished_folders_only() {
        let dir = std::env::temp_dir().join(format!("rlft-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["v1", "v2", "v10", ".v3.tmp", "notes", "vx"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        prune(&dir, Some(2)).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        left.sort();
        assert_eq!(left, ["notes", "v2", "vx"]);
        prune(&dir, None).unwrap();
        assert!(!dir.join("v2").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
