//! `rollout.servers`: where the rollout side's sampler calls run — in the trainer's process
//! (the default), on `N` servers it starts inside itself (`"local:N"`), or on inference servers
//! at the given base URLs.

use rlft_serve::Protocol;
use serde::{Deserialize, Serialize};

/// Where rollouts are sampled (`rollout.servers`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Spelled", into = "Spelled")]
pub enum Servers {
    /// In the trainer's process (rollout workers in async mode): `[]`, the default.
    #[default]
    InProcess,
    /// `"local:N"`: `N` servers started inside the trainer's process, each on its own threads
    /// and a free loopback port, stopped with the run.
    Local(usize),
    /// Inference servers at these base URLs (`http://host:port`).
    Urls(Vec<String>),
}

/// Most servers `"local:N"` starts in one process.
pub const MAX_LOCAL_SERVERS: usize = 64;

/// How a recipe spells `rollout.servers`: one string or a list of strings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Spelled {
    One(String),
    Many(Vec<String>),
}

impl TryFrom<Spelled> for Servers {
    type Error = String;

    fn try_from(s: Spelled) -> Result<Self, String> {
        let list = match s {
            Spelled::One(one) => vec![one],
            Spelled::Many(many) => many,
        };
        if list.is_empty() {
            return Ok(Servers::InProcess);
        }
        if let Some(local) = list.iter().find(|s| s.trim().starts_with("local:")) {
            if list.len() > 1 {
                return Err(format!(
                    "{local:?} cannot be listed with other servers: give \"local:N\" alone, or \
                     base URLs only"
                ));
            }
            return parse_local(local.trim()).map(Servers::Local);
        }
        let mut urls = Vec::with_capacity(list.len());
        for u in list {
            let u = u.trim().trim_end_matches('/').to_string();
            let rest = u
                .strip_prefix("http://")
                .or_else(|| u.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.contains(char::is_whitespace)) {
                return Err(format!(
                    "{u:?} is not a server's base URL: write \"http://host:port\" (or \
                     \"local:N\" for N servers inside the trainer)"
                ));
            }
            if urls.contains(&u) {
                return Err(format!("{u:?} is listed twice"));
            }
            urls.push(u);
        }
        Ok(Servers::Urls(urls))
    }
}

fn parse_local(s: &str) -> Result<usize, String> {
    let n = s
        .strip_prefix("local:")
        .and_then(|n| n.trim().parse::<usize>().ok())
        .ok_or_else(|| {
            format!("{s:?}: write \"local:N\" with N the number of servers, e.g. \"local:1\"")
        })?;
    if n == 0 || n > MAX_LOCAL_SERVERS {
        return Err(format!(
            "{s:?}: the number of local servers must be 1 to {MAX_LOCAL_SERVERS}"
        ));
    }
    Ok(n)
}

impl From<Servers> for Spelled {
    fn from(s: Servers) -> Self {
        match s {
            Servers::InProcess => Spelled::Many(Vec::new()),
            Servers::Local(n) => Spelled::One(format!("local:{n}")),
            Servers::Urls(u) => Spelled::Many(u),
        }
    }
}

impl Servers {
    /// Whether rollouts are sampled on servers.
    pub fn remote(&self) -> bool {
        *self != Servers::InProcess
    }

    /// How many servers.
    pub fn count(&self) -> usize {
        match self {
            Servers::InProcess => 0,
            Servers::Local(n) => *n,
            Servers::Urls(u) => u.len(),
        }
    }
}

impl super::Recipe {
    /// Checks `rollout.servers` and the settings that go with it; on error, the key and what
    /// is wrong.
    pub(crate) fn check_servers(&self) -> Result<(), (&'static str, String)> {
        let r = &self.rollout;
        if !r.servers.remote() {
            let defaults = super::RolloutSection::default();
            for (key, set) in [
                ("rollout.weights_dir", r.weights_dir.is_some()),
                (
                    "rollout.server_timeout_s",
                    r.server_timeout_s != defaults.server_timeout_s,
                ),
                (
                    "rollout.server_model",
                    r.server_model != defaults.server_model,
                ),
                (
                    "rollout.server_protocol",
                    r.server_protocol != defaults.server_protocol,
                ),
            ] {
                if set {
                    return Err((
                        key,
                        "applies to rollouts on servers and rollout.servers is empty; remove it \
                         or set rollout.servers (\"local:N\" or the servers' base URLs)"
                            .into(),
                    ));
                }
            }
            return Ok(());
        }
        if !(r.server_timeout_s.is_finite() && r.server_timeout_s > 0.0) {
            return Err((
                "rollout.server_timeout_s",
                format!(
                    "must be a number of seconds > 0, got {}",
                    r.server_timeout_s
                ),
            ));
        }
        if r.server_model.trim().is_empty() {
            return Err((
                "rollout.server_model",
                "is empty; give the name the servers serve (rlft serve's default is \"policy\")"
                    .into(),
            ));
        }
        if matches!(r.servers, Servers::Local(_)) && r.server_model != "policy" {
            return Err((
                "rollout.server_model",
                "names the model of servers given by URL; the local servers serve \"policy\": \
                 remove it"
                    .into(),
            ));
        }
        if r.weights_dir
            .as_ref()
            .is_some_and(|d| d.to_string_lossy().trim().is_empty())
        {
            return Err((
                "rollout.weights_dir",
                "is empty; name a folder every server can read, or remove it for \
                 <output_dir>/weights"
                    .into(),
            ));
        }
        if matches!(r.servers, Servers::Local(_)) && r.server_protocol != Protocol::Rlft {
            return Err((
                "rollout.server_protocol",
                format!(
                    "is {:?} and rollout.servers = \"local:N\" starts rlft's own servers; remove \
                     it, or list the {} servers' URLs",
                    r.server_protocol.name(),
                    r.server_protocol.name()
                ),
            ));
        }
        if r.server_protocol != Protocol::Rlft {
            self.check_foreign_servers()?;
        }
        if self.asynchrony.interruptible().is_some() {
            return Err((
                "async.interruptible",
                "hands new weights to a generation between decode steps inside the trainer, \
                 and rollout.servers samples on servers, which take new weights between \
                 requests; remove one of them"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl super::Recipe {
    /// What vLLM and SGLang servers cannot give: kept sets, routing, and (with some settings)
    /// `log μ` itself.
    fn check_foreign_servers(&self) -> Result<(), (&'static str, String)> {
        use crate::correction::{CorrectionMode, SamplingMask};
        let (r, a) = (&self.rollout, &self.algorithm);
        let name = r.server_protocol.name();
        if a.sampling_mask == SamplingMask::Replay {
            return Err((
                "algorithm.sampling_mask",
                format!(
                    "\"replay\" needs each token's kept set, which only rlft serve returns, and \
                     rollout.server_protocol = {name:?}; use \"off\" or rlft serve"
                ),
            ));
        }
        if a.router_replay {
            return Err((
                "algorithm.router_replay",
                format!(
                    "needs the sampler's expert routing, which only rlft serve returns, and \
                     rollout.server_protocol = {name:?}; remove it or use rlft serve"
                ),
            ));
        }
        let mode = a.correction.mode;
        if matches!(mode, CorrectionMode::Bypass | CorrectionMode::Auto)
            && !r.server_protocol.returns_mu(r.temperature, r.filtered())
        {
            let what = match r.server_protocol {
                Protocol::Vllm => {
                    "vLLM's log-probs (its default raw_logprobs) are the softmax before \
                     temperature and top-k / top-p / min-p, not the μ tokens were drawn from"
                }
                _ => {
                    "SGLang's log-probs are taken before top-k / top-p / min-p, not the μ \
                     tokens were drawn from"
                }
            };
            return Err((
                "algorithm.correction.mode",
                format!(
                    "{:?} uses the servers' log-probs as μ, and with rollout.server_protocol = \
                     {name:?} at rollout.temperature = {} {}: {what}. Set \
                     algorithm.correction.mode = \"decoupled\" or \"recompute\" (π_old from a \
                     forward pass){}",
                    mode_name(mode),
                    r.temperature,
                    if r.filtered() {
                        "with a filter"
                    } else {
                        "without filters"
                    },
                    match r.server_protocol {
                        Protocol::Vllm => ", or sample at temperature 1 without filters",
                        _ => ", or sample without filters",
                    }
                ),
            ));
        }
        Ok(())
    }
}

/// A correction mode as recipes write it.
fn mode_name(mode: crate::correction::CorrectionMode) -> String {
    serde_json::to_value(mode)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| format!("{mode:?}"))
}

impl schemars::JsonSchema for Servers {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Servers".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "anyOf": [
                { "type": "string" },
                { "type": "array", "items": { "type": "string" } }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, Serialize)]
    struct Probe {
        servers: Servers,
    }

    fn parse(toml_text: &str) -> Result<Servers, String> {
        toml::from_str::<Probe>(toml_text)
            .map(|p| p.servers)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_spelling_reads_and_writes_back() {
        assert_eq!(parse("servers = []").unwrap(), Servers::InProcess);
        assert_eq!(parse("servers = \"local:2\"").unwrap(), Servers::Local(2));
        assert_eq!(parse("servers = [\"local:1\"]").unwrap(), Servers::Local(1));
        let urls = parse("servers = [\"http://10.0.0.2:8000/\", \"https://b:1\"]").unwrap();
        assert_eq!(
            urls,
            Servers::Urls(vec!["http://10.0.0.2:8000".into(), "https://b:1".into()])
        );
        assert_eq!(urls.count(), 2);
        for s in [Servers::InProcess, Servers::Local(3), urls] {
            let text = toml::to_string(&Probe { servers: s.clone() }).unwrap();
            assert_eq!(parse(&text).unwrap(), s, "{text}");
        }
    }

    #[test]
    fn bad_spellings_say_how_to_write_it() {
        for (text, says) in [
            ("servers = \"local:0\"", "1 to 64"),
            ("servers = \"local:x\"", "local:N"),
            ("servers = \"localhost:8000\"", "local:N"),
            ("servers = [\"local:1\", \"http://a:1\"]", "alone"),
            ("servers = \"10.0.0.2:8000\"", "http://host:port"),
            ("servers = [\"http://\"]", "http://host:port"),
            ("servers = [\"http://a:1\", \"http://a:1/\"]", "twice"),
            ("servers = 3", "servers"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
