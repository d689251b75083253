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

use crate::recipe::{Recipe, Servers};
use crate::{Result, TrainError};
use burn::module::Module;
use burn::tensor::Device;
use rlft_model::{Tokenizer, Transformer, TransformerConfig};
use rlft_rollout::{Generated, Generator, RolloutError, SamplingConfig};
use rlft_serve::{Client, Policy, Server, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// What the fleet did since the last report (`server/*` metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerStats {
    /// Completions requests answered.
    pub requests: usize,
    /// Seconds those requests took, summed over requests.
    pub request_secs: f64,
    /// Tokens the servers generated.
    pub tokens: usize,
    /// Weight versions brought to the servers.
    pub syncs: usize,
    /// Seconds writing weights to `weights_dir`.
    pub write_secs: f64,
    /// Seconds the servers took to load them (every server's update route, side by side).
    pub load_secs: f64,
}

/// One server and the requests it holds.
struct Member {
    client: Client,
    busy: AtomicUsize,
}

/// What the weight pushes share: the version every server holds, the folders written.
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
                .map(|u| member(u, &r.server_model, timeout, api_key.clone()))
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
            for _ in 0..n {
                let server = self.local_config.start(policy.clone()).map_err(|e| {
                    TrainError::Servers(format!("a local server cannot start: {e}"))
                })?;
                v.local.push(server);
            }
            *self.members.write().unwrap_or_else(PoisonError::into_inner) = v
                .local
                .iter()
                .map(|s| member(&s.url(), "policy", self.timeout, None))
                .collect();
            v.serving = Some(version);
            let mut st = lock(&self.stats);
            st.syncs += 1;
            st.load_secs += t0.elapsed().as_secs_f64();
            return Ok(());
        }
        let t0 = Instant::now();
        let dir = self.write(version, weights())?;
        let t1 = Instant::now();
        let members = self.members.read().unwrap_or_else(PoisonError::into_inner);
        let failures: Vec<String> = std::thread::scope(|s| {
            let pushes: Vec<_> = members
                .iter()
                .map(|m| s.spawn(|| m.client.update_weights(&dir, version)))
                .collect();
            pushes
                .into_iter()
                .filter_map(|h| match h.join() {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some("the weight push panicked".into()),
                })
                .collect()
        });
        drop(members);
        if !failures.is_empty() {
            return Err(TrainError::Servers(format!(
                "weight version {version} did not reach every server ({}); check that \
                 every server runs the run's model and can read {}",
                failures.join("; "),
                self.weights_dir.display()
            )));
        }
        v.serving = Some(version);
        prune(&self.weights_dir, Some(version))?;
        let mut st = lock(&self.stats);
        st.syncs += 1;
        st.write_secs += (t1 - t0).as_secs_f64();
        st.load_secs += t1.elapsed().as_secs_f64();
        Ok(())
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

    /// A generator sending a rollout's calls to the fleet, starting at `version`.
    pub fn generator(&self, version: u64) -> FleetGenerator<'_> {
        FleetGenerator {
            fleet: self,
            version,
        }
    }

    /// The least busy server (the first of equals), counted busy until the guard drops.
    fn pick(&self) -> std::result::Result<(Client, Busy<'_>), RolloutError> {
        let members = self.members.read().unwrap_or_else(PoisonError::into_inner);
        let (k, m) = members
            .iter()
            .enumerate()
            .min_by_key(|(_, m)| m.busy.load(Ordering::Relaxed))
            .ok_or_else(|| {
                RolloutError::Server("no server is running: no weights were pushed yet".into())
            })?;
        m.busy.fetch_add(1, Ordering::Relaxed);
        Ok((m.client.clone(), Busy { fleet: self, k }))
    }
}

impl Drop for Fleet {
    /// Stops the local servers and removes the folders written for them (servers given by
    /// URL may still read theirs).
    fn drop(&mut self) {
        let v = std::mem::take(&mut *lock(&self.versions));
        if matches!(self.spec, Servers::Local(_)) {
            drop(v.local);
            let _ = prune(&self.weights_dir, None);
            let _ = std::fs::remove_dir(&self.weights_dir);
        }
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

fn member(url: &str, model: &str, timeout: Duration, api_key: Option<String>) -> Member {
    Member {
        client: Client::new(url, model, timeout).with_api_key(api_key),
        busy: AtomicUsize::new(0),
    }
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

/// Sends a rollout's sampler calls to the fleet (see [`Fleet::generator`]).
pub struct FleetGenerator<'f> {
    fleet: &'f Fleet,
    version: u64,
}

impl Generator for FleetGenerator<'_> {
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        cfg: &SamplingConfig,
    ) -> std::result::Result<Generated, RolloutError> {
        let (client, busy) = self.fleet.pick()?;
        let t0 = Instant::now();
        let answer = client.generate(prompts, cfg);
        drop(busy);
        let remote = answer.map_err(|e| RolloutError::Server(e.to_string()))?;
        let tokens: usize = remote.completions.iter().map(|c| c.tokens.len()).sum();
        if let Some(&newest) = remote.versions.iter().flatten().max() {
            self.version = self.version.max(newest);
        }
        let mut st = lock(&self.fleet.stats);
        st.requests += 1;
        st.request_secs += t0.elapsed().as_secs_f64();
        st.tokens += tokens;
        Ok(Generated {
            completions: remote.completions,
            versions: remote.versions,
        })
    }

    fn version(&self) -> u64 {
        self.version
    }
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
