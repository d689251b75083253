//! Environments: what happens after each model turn. Single-turn tasks end; tool-use tasks run
//! the tool call the model wrote and append the result as an observation (context for the next
//! turn, never training signal).
//!
//! Tool-call format: the model writes `<tool>name(arguments)</tool>`; the environment answers
//! `\n<result>output</result>\n`, or `<result>error: …</result>` for a malformed call, an unknown
//! tool, a tool error, a timeout or an oversized output. Tools are in-process Rust functions.

use crate::dataset::Example;
use crate::expr;
use std::collections::BTreeMap;
use std::sync::Arc;
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
    fn step(&self, example: &Example, turn: &str) -> EnvStep;
}

/// Prompt → completion → reward.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleTurn;

impl Environment for SingleTurn {
    fn step(&self, _: &Example, _: &str) -> EnvStep {
        EnvStep::Done
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

/// Multi-turn tool use.
#[derive(Clone)]
pub struct ToolEnv {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// Longest a tool call may run.
    pub timeout: Duration,
    /// Longest tool output, in bytes.
    pub max_output: usize,
}

impl Default for ToolEnv {
    fn default() -> Self {
        Self {
            tools: BTreeMap::new(),
            timeout: Duration::from_secs(2),
            max_output: 512,
        }
    }
}

impl ToolEnv {
    /// No tools yet; 2 s and 512 bytes per call.
    pub fn new() -> Self {
        Self::default()
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

    fn run(&self, call: &str) -> Result<String, String> {
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
        let args = args.to_string();
        let out = crate::spawn_guarded(move || tool.call(&args))
            .recv_timeout(self.timeout)
            .map_err(|_| format!("tool timed out after {:?}", self.timeout))?
            .unwrap_or_else(|| Err("tool panicked".into()))?;
        if out.len() > self.max_output {
            return Err(format!(
                "tool output of {} bytes exceeds the {}-byte limit",
                out.len(),
                self.max_output
            ));
        }
        Ok(out)
    }
}

impl Environment for ToolEnv {
    fn stop_strings(&self) -> Vec<String> {
        vec!["</tool>".into()]
    }

    fn step(&self, _: &Example, turn: &str) -> EnvStep {
        let Some(end) = turn.rfind("</tool>") else {
            return EnvStep::Done;
        };
        // Only a call that ends the turn is executed.
        if !turn[end + "</tool>".len()..].trim().is_empty() {
            return EnvStep::Done;
        }
        let out = match turn[..end].rfind("<tool>") {
            None => Err("malformed call: '</tool>' without '<tool>'".to_string()),
            Some(start) => self.run(&turn[start + "<tool>".len()..end]),
        };
        EnvStep::Observation(Self::format_observation(&match out {
            Ok(v) => v,
            Err(e) => format!("error: {e}"),
        }))
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
        let obs = |turn: &str| match env.step(&ex, turn) {
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
}
