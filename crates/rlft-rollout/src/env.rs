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
use std::sync::{Arc, OnceLock};
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
}

/// Prompt → completion → reward.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleTurn;

impl Environment for SingleTurn {
    fn step(&self, _: &Example, _: &str) -> Result<EnvStep> {
        Ok(EnvStep::Done)
    }
}

/// An in-process tool.
pub trait Tool: Send + Sync {
    /// The name used in calls.
    fn name(&self) -> &str;
    /// Runs the tool on the text between the parentheses.
    fn call(&self, args: &str) -> Result<String, String>;
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

    /// The tool's output, or what went wrong with the call (`Ok(Err(..))`: an observation).
    fn run(&self, call: &str) -> Result<Result<String, String>> {
        let (tool, args) = match self.parse(call) {
            Ok(found) => found,
            Err(e) => return Ok(Err(e)),
        };
        let label = format!("tool '{}'", tool.name());
        let out = match self
            .pool()
            .run(label, self.timeout, move || tool.call(&args))?
        {
            JobOutcome::Finished(out) => out,
            JobOutcome::Panicked(msg) => Err(format!("tool panicked: {msg}")),
            JobOutcome::TimedOut { after, .. } => Err(format!("tool timed out after {after:?}")),
        };
        Ok(out.and_then(|out| {
            if out.len() > self.max_output {
                return Err(format!(
                    "tool output of {} bytes exceeds the {}-byte limit",
                    out.len(),
                    self.max_output
                ));
            }
            Ok(out)
        }))
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

    /// Runs the tool call that ends the turn, if any.
    ///
    /// # Errors
    ///
    /// [`RolloutError::WorkersStuck`](crate::RolloutError::WorkersStuck) when every tool
    /// worker is stuck in a tool that never returned.
    fn step(&self, _: &Example, turn: &str) -> Result<EnvStep> {
        let Some(end) = turn.rfind("</tool>") else {
            return Ok(EnvStep::Done);
        };
        // Only a call that ends the turn is executed.
        if !turn[end + "</tool>".len()..].trim().is_empty() {
            return Ok(EnvStep::Done);
        }
        let out = match turn[..end].rfind("<tool>") {
            None => Err("malformed call: '</tool>' without '<tool>'".to_string()),
            Some(start) => self.run(&turn[start + "<tool>".len()..end])?,
        };
        Ok(EnvStep::Observation(Self::format_observation(&match out {
            Ok(v) => v,
            Err(e) => format!("error: {e}"),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Prompt;

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
        let ex = Example {
            prompt: Prompt::Text(String::new()),
            answer: String::new(),
            metadata: serde_json::Value::Null,
        };
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
        let ex = Example {
            prompt: Prompt::Text(String::new()),
            answer: String::new(),
            metadata: serde_json::Value::Null,
        };
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
