//! Built-in tasks: deterministic problem generators with disjoint train/test splits, difficulty
//! levels, reference completions (for SFT warm-up and tests) and verifiers.
//!
//! - `arithmetic`: `a + b`, `a - b`, `a * b`; answer is the last number of the completion.
//! - `countdown`: reach a target with given numbers, each used exactly once; answer is an
//!   expression in `<answer>…</answer>`.
//! - `calculator_tool`: multi-digit arithmetic with a `calc(expr)` tool (multi-turn); answer in
//!   `<answer>…</answer>`.
//!
//! A problem's split is a hash of its text, so train and test never share a problem.

use crate::dataset::{Example, Prompt};
use crate::env::{Calculator, Environment, SingleTurn, ToolEnv};
use crate::expr;
use crate::reward::{AnswerFormat, ExactMatch, FormatReward, RewardSet};
use crate::{Result, RolloutError};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rlft_algo::seed::spread;
use rlft_model::ChatMessage;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Train or held-out test problems.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// About 90 % of the problem space.
    Train,
    /// The other 10 %.
    Test,
}

/// Which built-in task.
#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// `a op b`.
    Arithmetic,
    /// Reach a target with given numbers.
    Countdown,
    /// Arithmetic with a calculator tool.
    CalculatorTool,
}

impl TaskKind {
    /// Every task name.
    pub const NAMES: [&'static str; 3] = ["arithmetic", "countdown", "calculator_tool"];

    /// From its name.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "arithmetic" => Ok(Self::Arithmetic),
            "countdown" => Ok(Self::Countdown),
            "calculator_tool" => Ok(Self::CalculatorTool),
            other => Err(RolloutError::Config(format!(
                "unknown task '{other}'; built-in tasks: {}",
                Self::NAMES.join(", ")
            ))),
        }
    }
}

/// A built-in task at one difficulty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Which task.
    pub kind: TaskKind,
    /// 1 (easiest) to 3.
    pub difficulty: u32,
    /// Operations for `arithmetic` (any of `+`, `-`, `*`).
    pub ops: Vec<char>,
    /// Ask for chat-formatted prompts (`messages`) rather than plain text.
    pub chat: bool,
    /// Generator seed (the split does not depend on it).
    pub seed: u64,
}

/// FNV-1a: a hash that is the same on every platform and Rust version.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn split_of(key: &str) -> Split {
    if fnv(key).is_multiple_of(10) {
        Split::Test
    } else {
        Split::Train
    }
}

impl Task {
    /// A task with default settings (`+ - *`, plain-text prompts, seed 0).
    pub fn new(kind: TaskKind, difficulty: u32) -> Result<Self> {
        if !(1..=3).contains(&difficulty) {
            return Err(RolloutError::Config(format!(
                "difficulty must be 1, 2 or 3, got {difficulty}"
            )));
        }
        Ok(Self {
            kind,
            difficulty,
            ops: vec!['+', '-', '*'],
            chat: false,
            seed: 0,
        })
    }

    /// Task name.
    pub fn name(&self) -> &'static str {
        TaskKind::NAMES[self.kind as usize]
    }

    /// Problem `index` of `split`: the same arguments always give the same problem.
    pub fn example(&self, split: Split, index: u64) -> Example {
        for attempt in 0u64.. {
            let mut rng = StdRng::seed_from_u64(
                self.seed
                    ^ fnv(self.name())
                    ^ spread(index)
                    ^ attempt.wrapping_mul(0xD1B5_4A32_D192_ED03)
                    ^ (split as u64) << 62,
            );
            let (question, answer, meta) = match self.kind {
                TaskKind::Arithmetic | TaskKind::CalculatorTool => self.arith(&mut rng),
                TaskKind::Countdown => self.countdown(&mut rng),
            };
            if split_of(&question) == split {
                return self.wrap(question, answer, meta);
            }
        }
        unreachable!("the attempt loop is unbounded")
    }

    /// `n` problems of `split` starting at index 0.
    pub fn examples(&self, split: Split, n: usize) -> Vec<Example> {
        (0..n as u64).map(|i| self.example(split, i)).collect()
    }

    fn range(&self) -> (i64, i64) {
        match (self.kind, self.difficulty) {
            (TaskKind::Arithmetic, 1) => (0, 9),
            (TaskKind::Arithmetic, 2) => (10, 99),
            (TaskKind::Arithmetic, _) => (100, 999),
            (_, 1) => (10, 99),
            (_, 2) => (100, 999),
            (_, _) => (1000, 9999),
        }
    }

    fn arith(&self, rng: &mut StdRng) -> (String, String, serde_json::Value) {
        let (lo, hi) = self.range();
        let a = rng.random_range(lo..=hi);
        let b = rng.random_range(lo..=hi);
        let ops = if self.ops.is_empty() {
            &['+'][..]
        } else {
            &self.ops[..]
        };
        let op = ops[rng.random_range(0..ops.len())];
        let v = match op {
            '-' => a - b,
            '*' => a * b,
            _ => a + b,
        };
        let q = format!("{a} {op} {b}");
        (
            q,
            v.to_string(),
            serde_json::json!({"a": a, "b": b, "op": op.to_string()}),
        )
    }

    fn countdown(&self, rng: &mut StdRng) -> (String, String, serde_json::Value) {
        let (n, hi) = match self.difficulty {
            1 => (3, 10),
            2 => (4, 20),
            _ => (5, 25),
        };
        loop {
            let nums: Vec<i64> = (0..n).map(|_| rng.random_range(1..=hi)).collect();
            // Combine left to right with random operations, keeping integers > 0.
            let mut expr = nums[0].to_string();
            let mut value = nums[0];
            for &x in &nums[1..] {
                let choices: Vec<char> = ['+', '-', '*', '/']
                    .into_iter()
                    .filter(|&op| match op {
                        '-' => value - x > 0,
                        '/' => value % x == 0,
                        _ => true,
                    })
                    .collect();
                let op = choices[rng.random_range(0..choices.len())];
                value = match op {
                    '+' => value + x,
                    '-' => value - x,
                    '*' => value * x,
                    _ => value / x,
                };
                expr = format!("({expr} {op} {x})");
            }
            if value > 1 && value < 1000 {
                let expr = expr[1..expr.len() - 1].to_string();
                let list = nums
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                let q = format!("[{list}] -> {value}");
                return (
                    q,
                    expr,
                    serde_json::json!({"numbers": nums, "target": value}),
                );
            }
        }
    }

    fn wrap(&self, question: String, answer: String, mut meta: serde_json::Value) -> Example {
        meta["task"] = self.name().into();
        meta["difficulty"] = self.difficulty.into();
        let text = match self.kind {
            TaskKind::Arithmetic => format!("What is {question}? Answer with the number."),
            TaskKind::Countdown => {
                let nums = &meta["numbers"];
                let target = &meta["target"];
                format!(
                    "Using the numbers {nums}, each exactly once, and + - * / with parentheses, \
                     make {target}. Write the expression as <answer>EXPRESSION</answer>."
                )
            }
            TaskKind::CalculatorTool => format!(
                "What is {question}? You may use a calculator by writing <tool>calc(EXPRESSION)</tool>; \
                 its result comes back as <result>VALUE</result>. Give the final answer as \
                 <answer>NUMBER</answer>."
            ),
        };
        let prompt = if self.chat {
            Prompt::Messages(vec![ChatMessage::user(text)])
        } else {
            Prompt::Text(text)
        };
        Example {
            prompt,
            answer,
            alternatives: Vec::new(),
            completion: None,
            metadata: meta,
        }
    }

    /// A correct completion of `ex` as the model should write it; for `calculator_tool` the
    /// model's turns and the tool's observations, in order (`(text, is_observation)`).
    pub fn reference_turns(&self, ex: &Example) -> Vec<(String, bool)> {
        match self.kind {
            TaskKind::Arithmetic => vec![(ex.answer.clone(), false)],
            TaskKind::Countdown => vec![(format!("<answer>{}</answer>", ex.answer), false)],
            TaskKind::CalculatorTool => {
                let m = &ex.metadata;
                let call = format!(
                    "<tool>calc({} {} {})</tool>",
                    m["a"],
                    m["op"].as_str().unwrap_or("+"),
                    m["b"]
                );
                vec![
                    (call, false),
                    (ToolEnv::format_observation(&ex.answer), true),
                    (format!("<answer>{}</answer>", ex.answer), false),
                ]
            }
        }
    }

    /// `ex` with its answer one too high where the answer is a number (a weak teacher's
    /// demonstration for the SFT warm-up); other examples unchanged.
    pub fn off_by_one(&self, mut ex: Example) -> Example {
        if let Ok(v) = ex.answer.parse::<i64>() {
            ex.answer = (v + 1).to_string();
        }
        ex
    }

    /// Whether `completion` solves `ex`.
    pub fn is_correct(&self, ex: &Example, completion: &str) -> bool {
        match self.kind {
            TaskKind::Arithmetic => {
                ExactMatch::new(AnswerFormat::LastNumber).is_correct(completion, &ex.answer)
            }
            TaskKind::CalculatorTool => {
                ExactMatch::new(AnswerFormat::AnswerTag).is_correct(completion, &ex.answer)
            }
            TaskKind::Countdown => {
                let Some(e) = AnswerFormat::AnswerTag.extract(completion) else {
                    return false;
                };
                let mut used = expr::numbers(&e);
                let mut given: Vec<f64> = ex.metadata["numbers"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
                    .unwrap_or_default();
                used.sort_by(f64::total_cmp);
                given.sort_by(f64::total_cmp);
                let target = ex.metadata["target"].as_f64().unwrap_or(f64::NAN);
                used == given && expr::eval(&e).is_ok_and(|v| (v - target).abs() < 1e-9)
            }
        }
    }

    /// The task's reward: 1 for a correct answer (plus 0.1 for the answer format on the tasks
    /// that use `<answer>` tags).
    pub fn rewards(&self) -> RewardSet {
        let verifier = TaskVerifier(self.clone());
        let set = RewardSet::new().with(1.0, verifier);
        match self.kind {
            TaskKind::Arithmetic => set,
            _ => set.with(0.1, FormatReward(AnswerFormat::AnswerTag)),
        }
    }

    /// The environment the task runs in.
    pub fn environment(&self) -> Arc<dyn Environment> {
        match self.kind {
            TaskKind::CalculatorTool => Arc::new(ToolEnv::new().with_tool(Calculator)),
            _ => Arc::new(SingleTurn),
        }
    }
}

/// A task's verifier as a [`crate::Reward`]: it needs the example's metadata, which travels in
/// [`crate::RewardInput::metadata`].
struct TaskVerifier(Task);

impl crate::Reward for TaskVerifier {
    fn name(&self) -> &str {
        "correct"
    }
    fn score(&self, x: &crate::RewardInput) -> std::result::Result<f64, String> {
        let ex = Example {
            prompt: Prompt::Text(x.prompt.clone()),
            answer: x.answer.clone(),
            alternatives: x.alternatives.clone(),
            completion: None,
            metadata: x.metadata.clone(),
        };
        Ok(f64::from(u8::from(self.0.is_correct(&ex, &x.completion))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_tasks() -> Vec<Task> {
        let mut out = Vec::new();
        for kind in [
            TaskKind::Arithmetic,
            TaskKind::Countdown,
            TaskKind::CalculatorTool,
        ] {
            for d in 1..=3 {
                out.push(Task::new(kind, d).unwrap());
            }
        }
        out
    }

    #[test]
    fn deterministic_and_disjoint_splits() {
        for task in all_tasks() {
            let train = task.examples(Split::Train, 300);
            assert_eq!(train, task.examples(Split::Train, 300), "{}", task.name());
            let test = task.examples(Split::Test, 50);
            let train_q: std::collections::HashSet<String> = train
                .iter()
                .map(|e| e.prompt.user_text().to_string())
                .collect();
            assert!(
                test.iter().all(|e| !train_q.contains(e.prompt.user_text())),
                "{} d{}: a test problem is in train",
                task.name(),
                task.difficulty
            );
        }
        assert!(Task::new(TaskKind::Arithmetic, 4).is_err());
        assert!(
            TaskKind::parse("sudoku")
                .unwrap_err()
                .to_string()
                .contains("arithmetic")
        );
    }

    #[test]
    fn a_weak_teachers_answer_is_one_too_high_and_judged_wrong() {
        let task = Task::new(TaskKind::Arithmetic, 1).unwrap();
        for ex in task.examples(Split::Train, 20) {
            let weak = task.off_by_one(ex.clone());
            let v: i64 = ex.answer.parse().unwrap();
            assert_eq!(weak.answer, (v + 1).to_string());
            assert_eq!(weak.prompt, ex.prompt);
            let (shown, _) = &task.reference_turns(&weak)[0];
            assert!(!task.is_correct(&ex, shown), "{shown} for {}", ex.answer);
        }
    }

    #[test]
    fn verifiers_accept_references_and_reject_perturbations() {
        for task in all_tasks() {
            for ex in task.examples(Split::Train, 40) {
                let turns = task.reference_turns(&ex);
                let full: String = turns.iter().map(|(t, _)| t.as_str()).collect();
                assert!(
                    task.is_correct(&ex, &full),
                    "{} {:?} {full}",
                    task.name(),
                    ex
                );
                let wrong = match task.kind {
                    TaskKind::Countdown => {
                        // Change the last number of the expression.
                        let e = &ex.answer;
                        let cut = e.rfind(|c: char| !c.is_ascii_digit()).map_or(0, |i| i + 1);
                        let last: i64 = e[cut..].parse().unwrap();
                        format!("<answer>{}{}</answer>", &e[..cut], last + 1)
                    }
                    _ => {
                        let v: i64 = ex.answer.parse().unwrap();
                        full.replace(&format!(">{v}<"), &format!(">{}<", v + 1))
                            .replace(&ex.answer, &(v + 1).to_string())
                    }
                };
                assert!(
                    !task.is_correct(&ex, &wrong),
                    "{} accepted {wrong}",
                    task.name()
                );
                let outcome = task
                    .rewards()
                    .score(vec![crate::RewardInput {
                        prompt: ex.prompt.user_text().into(),
                        completion: full.clone(),
                        answer: ex.answer.clone(),
                        metadata: ex.metadata.clone(),
                        ..Default::default()
                    }])
                    .unwrap();
                assert!(outcome[0].total().unwrap() >= 1.0);
            }
        }
    }
}
