//! Environments: what happens after each model turn. Single-turn tasks end; tool-use tasks run
//! the tool call the model wrote and append the result as an observation (context for the next
//! turn, never training signal).
//!
//! Tool-call format: the model writes `<tool>name(arguments)</tool>`; the environment answers
//! `\n<result>output</result>\n`, or `<result>error: …</result>` for a malformed call, an unknown
//! tool, a tool error, a panic, a timeout or an oversized output. Tools are in-process Rust
//! functions run on a bounded [`WorkerPool`] under a per-call deadline; only a pool whose every
//! worker is stuck in a tool that never returns stops the run
//! ([`RolloutError::WorkersStuck`](crate::RolloutError::WorkersStuck)).

use crate::Result;
use crate::dataset::Example;
use crate::expr;
use crate::pool::{JobOutcome, WorkerPool};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// What follows a model turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvStep {
    /// The episode is over.
    Done,
    /// Append this text (outside the loss mask) and let the model continue.
    Observation(String),
}

/// An environment the rollout engine drives.
pub trait Environment: Send + Sync {
    /// Strings that end a model turn early so the environment can respond (e.g. `</tool>`).
    fn stop_strings(&self) -> Vec<String> {
        Vec::new()
    }
    /// Reacts to the model's latest turn.
    ///
    /// # Errors
    ///
    /// An error stops the rollout; keep it for what the run cannot go on from (e.g.
    /// [`RolloutError::WorkersStuck`](crate::RolloutError::WorkersStuck)). A failed tool call
    /// is an observation, not an error.
    fn step(&self, example: &Example, turn: &str) -> Result<EnvStep>;

    /// As [`step`](Environment::step), with the episode's state: `Null` at the episode's
    /// start, then whatever the environment left in it after the previous turn (the rollout
    /// engine keeps one per episode). The default ignores it.
    ///
    /// # Errors
    ///
    /// As [`step`](Environment::step).
    fn step_in_episode(
        &self,
        example: &Example,
        turn: &str,
        state: &mut serde_json::Value,
    ) -> Result<EnvStep> {
        let _ = state;
        self.step(example, turn)
    }

    /// Counters since the previous call, by metric name (e.g. `tool/<name>/calls`), for the
    /// trainer's step metrics. The default has none.
    fn take_metrics(&self) -> BTreeMap<String, f64> {
        BTreeMap::new()
    }
}

/// Prompt → completion → reward.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleTurn;

impl Environment for SingleTurn {
    fn step(&self, _: &Example, _: &str) -> Result<EnvStep> {
        Ok(EnvStep::Done)
    }
}

/// A tool: an in-process function, or an external program ([`crate::command::CommandTool`]).
pub trait Tool: Send + Sync {
    /// The name used in calls.
    fn name(&self) -> &str;
    /// Runs the tool on the text between the parentheses.
    fn call(&self, args: &str) -> Result<String, String>;
    /// As [`call`](Tool::call), seeing the example's metadata and the episode's earlier calls
    /// (`state`: `{"calls": [{"tool", "args", "output"}, ...]}`). The default ignores them.
    fn call_in_episode(
        &self,
        args: &str,
        metadata: &serde_json::Value,
        state: &serde_json::Value,
    ) -> Result<String, String> {
        let _ = (metadata, state);
        self.call(args)
    }
}

/// Evaluates arithmetic (`+ - * /`, parentheses) with [`crate::expr`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Calculator;

impl Tool for Calculator {
    fn name(&self) -> &str {
        "calc"
    }
    fn call(&self, args: &str) -> Result<String, String> {
        let v = expr::eval(args)?;
        Ok(if v.fract() == 0.0 && v.abs() < 1e15 {
            format!("{}", v as i64)
        } else {
            format!("{v}")
        })
    }
}

/// Any tool under another name (what the model writes in `<tool>name(...)</tool>`).
#[derive(Debug, Clone)]
pub struct NamedTool<T> {
    /// The name.
    pub name: String,
    /// The tool.
    pub tool: T,
}

impl<T: Tool> Tool for NamedTool<T> {
    fn name(&self) -> &str {
        &self.name
    }
    fn call(&self, args: &str) -> Result<String, String> {
        self.tool.call(args)
    }
    fn call_in_episode(
        &self,
        args: &str,
        metadata: &serde_json::Value,
        state: &serde_json::Value,
    ) -> Result<String, String> {
        self.tool.call_in_episode(args, metadata, state)
    }
}

/// Multi-turn tool use; calls run on a worker pool shared by the environment's clones.
#[derive(Clone)]
pub struct ToolEnv {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// Longest a tool call may run, counted from when a worker starts it.
    pub timeout: Duration,
    /// Longest tool output, in bytes.
    pub max_output: usize,
    workers: usize,
    /// Started on the first call; clones share it.
    pool: Arc<OnceLock<WorkerPool>>,
    /// Calls and failed calls per tool since [`Environment::take_metrics`]; clones share them.
    stats: Arc<Mutex<BTreeMap<String, (u64, u64)>>>,
}

impl std::fmt::Debug for ToolEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolEnv")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("max_output", &self.max_output)
            .field("workers", &self.workers)
            .finish()
    }
}

impl Default for ToolEnv {
    fn default() -> Self {
        Self {
            tools: BTreeMap::new(),
            timeout: Duration::from_secs(2),
            max_output: 512,
            workers: WorkerPool::default_size(),
            pool: Arc::default(),
            stats: Arc::default(),
        }
    }
}

impl ToolEnv {
    /// No tools yet; 2 s and 512 bytes per call, [`WorkerPool::default_size`] workers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the per-call deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs tools on at most `workers` threads (at least 1). The environment (and its clones
    /// made from now on) gets a pool of its own.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self.pool = Arc::default();
        self
    }

    /// The worker pool tool calls run on, shared by this environment's clones.
    pub fn pool(&self) -> &WorkerPool {
        self.pool
            .get_or_init(|| WorkerPool::new("tool", self.workers))
    }

    /// Adds a tool.
    pub fn with_tool(mut self, tool: impl Tool + 'static) -> Self {
        self.tools.insert(tool.name().to_string(), Arc::new(tool));
        self
    }

    /// The observation text for a tool output.
    pub fn format_observation(output: &str) -> String {
        format!("\n<result>{output}</result>\n")
    }

    /// Sets the longest tool output, in bytes.
    pub fn with_max_output(mut self, bytes: usize) -> Self {
        self.max_output = bytes;
        self
    }

    /// The tool's output, or what went wrong with the call (`Ok(Err(..))`: an observation);
    /// counted per tool (an unknown tool or a malformed call under `invalid`).
    fn run(
        &self,
        call: &str,
        metadata: &serde_json::Value,
        state: &serde_json::Value,
    ) -> Result<(String, Result<String, String>)> {
        let (tool, args) = match self.parse(call) {
            Ok(found) => found,
            Err(e) => {
                self.count("invalid", true);
                return Ok(("invalid".into(), Err(e)));
            }
        };
        let name = tool.name().to_string();
        let label = format!("tool '{name}'");
        let (metadata, state) = (metadata.clone(), state.clone());
        let out = match self.pool().run(label, self.timeout, move || {
            tool.call_in_episode(&args, &metadata, &state)
        })? {
            JobOutcome::Finished(out) => out,
            JobOutcome::Panicked(msg) => Err(format!("tool panicked: {msg}")),
            JobOutcome::TimedOut { after, .. } => Err(format!("tool timed out after {after:?}")),
        };
        let out = out.and_then(|out| {
            if out.len() > self.max_output {
                return Err(format!(
                    "tool output of {} bytes exceeds the {}-byte limit",
                    out.len(),
                    self.max_output
                ));
            }
            Ok(out)
        });
        self.count(&name, out.is_err());
        Ok((name, out))
    }

    fn count(&self, tool: &str, failed: bool) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        let c = stats.entry(tool.to_string()).or_default();
        c.0 += 1;
        c.1 += u64::from(failed);
    }

    /// The tool and the arguments of a call.
    fn parse(&self, call: &str) -> Result<(Arc<dyn Tool>, String), String> {
        let call = call.trim();
        let (name, rest) = call.split_once('(').ok_or_else(|| {
            format!("malformed call '{call}'; write <tool>name(arguments)</tool>")
        })?;
        let args = rest
            .strip_suffix(')')
            .ok_or_else(|| format!("malformed call '{call}'; missing ')'"))?;
        let tool = self.tools.get(name.trim()).cloned().ok_or_else(|| {
            let names: Vec<&str> = self.tools.keys().map(String::as_str).collect();
            format!(
                "unknown tool '{}'; available: {}",
                name.trim(),
                names.join(", ")
            )
        })?;
        Ok((tool, args.to_string()))
    }
}

impl Environment for ToolEnv {
    fn stop_strings(&self) -> Vec<String> {
        vec!["</tool>".into()]
    }

    fn step(&self, example: &Example, turn: &str) -> Result<EnvStep> {
        self.step_in_episode(example, turn, &mut serde_json::Value::Null)
    }

    /// Runs the tool call that ends the turn, if any, and records it in the episode's state
    /// (`{"calls": [{"tool", "args", "output"}]}`, seen by later calls of the episode).
    ///
    /// # Errors
    ///
    /// [`RolloutError::WorkersStuck`](crate::RolloutError::WorkersStuck) when every tool
    /// worker is stuck in a tool that never returned.
    fn step_in_episode(
        &self,
        example: &Example,
        turn: &str,
        state: &mut serde_json::Value,
    ) -> Result<EnvStep> {
        let Some(end) = turn.rfind("</tool>") else {
            return Ok(EnvStep::Done);
        };
        // Only a call that ends the turn is executed.
        if !turn[end + "</tool>".len()..].trim().is_empty() {
            return Ok(EnvStep::Done);
        }
        let (call, (tool, out)) = match turn[..end].rfind("<tool>") {
            None => {
                self.count("invalid", true);
                (
                    String::new(),
                    (
                        "invalid".to_string(),
                        Err("malformed call: '</tool>' without '<tool>'".to_string()),
                    ),
                )
            }
            Some(start) => {
                let call = turn[start + "<tool>".len()..end].to_string();
                let run = self.run(&call, &example.metadata, state)?;
                (call, run)
            }
        };
        let text = match out {
            Ok(v) => v,
            Err(e) => format!("error: {e}"),
        };
        if !state.is_object() {
            *state = serde_json::json!({"calls": []});
        }
        if let Some(calls) = state.get_mut("calls").and_then(|c| c.as_array_mut()) {
            calls.push(serde_json::json!({"tool": tool, "args": call, "output": text}));
        }
        Ok(EnvStep::Observation(Self::format_observation(&text)))
    }

    /// `tool/<name>/calls` and `tool/<name>/errors` since the previous call, for every tool
    /// (0 when not called) and `invalid` (unknown tools and malformed calls) once there was one.
    fn take_metrics(&self) -> BTreeMap<String, f64> {
        let mut stats = std::mem::take(&mut *self.stats.lock().unwrap_or_else(|e| e.into_inner()));
        for name in self.tools.keys() {
            stats.entry(name.clone()).or_default();
        }
        stats
            .into_iter()
            .flat_map(|(tool, (calls, errors))| {
                [
                    (format!("tool/{tool}/calls"), calls as f64),
                    (format!("tool/{tool}/errors"), errors as f64),
                ]
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Prompt;

    /// An example with nothing in it (the tools here do not read it).
    fn blank() -> Example {
        Example {
            prompt: Prompt::Text(String::new()),
            answer: String::new(),
            alternatives: Vec::new(),
            completion: None,
            metadata: serde_json::Value::Null,
        }
    }

    struct Sleepy;
    impl Tool for Sleepy {
        fn name(&self) -> &str {
            "sleep"
        }
        fn call(&self, _: &str) -> Result<String, String> {
            std::thread::sleep(Duration::from_secs(3));
            Ok(String::new())
        }
    }
    struct Chatty;
    impl Tool for Chatty {
        fn name(&self) -> &str {
            "chatty"
        }
        fn call(&self, _: &str) -> Result<String, String> {
            Ok("x".repeat(10_000))
        }
    }

    #[test]
    fn tool_calls_and_their_errors_are_observations() {
        let env = ToolEnv {
            timeout: Duration::from_millis(100),
            ..ToolEnv::new()
        }
        .with_tool(Calculator)
        .with_tool(Sleepy)
        .with_tool(Chatty);
        let ex = blank();
        let obs = |turn: &str| match env.step(&ex, turn).unwrap() {
            EnvStep::Observation(o) => o,
            EnvStep::Done => "DONE".into(),
        };
        assert_eq!(
            obs("Let me compute <tool>calc(12 * 34)</tool>"),
            "\n<result>408</result>\n"
        );
        assert_eq!(obs("<answer>408</answer>"), "DONE");
        assert_eq!(obs("<tool>calc(1)</tool> and more text"), "DONE");
        for (turn, what) in [
            ("<tool>calc 1+1</tool>", "error: malformed call"),
            (
                "<tool>python(1)</tool>",
                "error: unknown tool 'python'; available: calc, chatty, sleep",
            ),
            ("<tool>calc(1/0)</tool>", "error: division by zero"),
            ("oops </tool>", "error: malformed call"),
            ("<tool>sleep()</tool>", "error: tool timed out"),
            ("<tool>chatty()</tool>", "exceeds the 512-byte limit"),
        ] {
            let o = obs(turn);
            assert!(o.contains(what), "{turn}: {o}");
        }
    }

    #[test]
    fn the_episode_state_records_calls_and_metrics_count_them() {
        let env = ToolEnv::new().with_tool(Calculator);
        let ex = blank();
        let mut state = serde_json::Value::Null;
        for turn in [
            "<tool>calc(1+2)</tool>",
            "<tool>calc(1/0)</tool>",
            "<tool>nope(1)</tool>",
        ] {
            env.step_in_episode(&ex, turn, &mut state).unwrap();
        }
        let calls = state["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 3);
        assert_eq!(
            calls[0],
            serde_json::json!({"tool": "calc", "args": "calc(1+2)", "output": "3"})
        );
        assert_eq!(calls[2]["tool"], "invalid");
        let m = env.take_metrics();
        assert_eq!((m["tool/calc/calls"], m["tool/calc/errors"]), (2.0, 1.0));
        assert_eq!(
            (m["tool/invalid/calls"], m["tool/invalid/errors"]),
            (1.0, 1.0)
        );
        let again = env.take_metrics();
        assert_eq!(again.len(), 2, "every tool, 0 when not called: {again:?}");
        assert_eq!(
            again["tool/calc/calls"], 0.0,
            "counted since the previous call"
        );
    }

    struct Hang(crate::pool::testing::Gate);
    impl Tool for Hang {
        fn name(&self) -> &str {
            "hang"
        }
        fn call(&self, _: &str) -> Result<String, String> {
            self.0.hang();
            Ok(String::new())
        }
    }

    #[test]
    fn a_hung_tool_times_out_and_all_tool_workers_stuck_stops_the_run() {
        let gate = crate::pool::testing::Gate::default();
        let env = ToolEnv::new()
            .with_tool(Calculator)
            .with_tool(Hang(gate.clone()))
            .with_timeout(Duration::from_millis(100))
            .with_workers(2);
        let ex = blank();
        let obs = |turn: &str| env.step(&ex, turn);
        let hang = EnvStep::Observation(ToolEnv::format_observation(
            "error: tool timed out after 100ms",
        ));
        let t = std::time::Instant::now();
        assert_eq!(obs("<tool>hang()</tool>").unwrap(), hang);
        let took = t.elapsed();
        assert!(
            (Duration::from_millis(100)..Duration::from_secs(1)).contains(&took),
            "{took:?}"
        );
        // The run goes on with the other worker.
        for _ in 0..5 {
            assert_eq!(
                obs("<tool>calc(2+3)</tool>").unwrap(),
                EnvStep::Observation(ToolEnv::format_observation("5"))
            );
        }
        assert_eq!(obs("<tool>hang()</tool>").unwrap(), hang);
        // Both workers stuck: an error, not a hang.
        let t = std::time::Instant::now();
        let err = obs("<tool>calc(1)</tool>").unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let msg = err.to_string();
        assert!(msg.contains("all 2 tool worker threads are stuck"), "{msg}");
        assert!(msg.contains("tool 'hang' on 2 worker(s)"), "{msg}");
        let s = env.pool().stats();
        assert_eq!((s.size, s.max_alive, s.stuck), (2, 2, 2), "{s:?}");
        gate.open();
        crate::pool::testing::wait_idle(env.pool());
        assert!(obs("<tool>calc(1)</tool>").is_ok());
    }
}
