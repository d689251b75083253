//! Where a run's examples, environment and rewards come from: the recipe's `[data]` files,
//! `[[tool]]`s and `[[reward]]` terms, or the built-in task's generator, environment and
//! verifier.

use crate::recipe::{
    Recipe, RewardKind, RewardTerm, ToolKind, ToolSpec, correctness_term, effective_terms,
};
use crate::{Result, TrainError};
use rlft_algo::shaping::OverlongPenalty;
use rlft_model::Tokenizer;
use rlft_rollout::reward::parse_number;
use rlft_rollout::{
    AnswerFormat, BySource, Calculator, CommandReward, CommandTool, DataRole, Dataset, Environment,
    ExactMatch, Example, FormatReward, Gsm8kMethod, LengthPenalty, Named, NamedTool,
    OverlongShaping, RegexMatch, Reward, RewardSet, Scorer, SingleTurn, Split, Task, ToolEnv,
};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Seconds a `command` term may take per sample when the recipe gives no `timeout_s`.
pub const DEFAULT_COMMAND_TIMEOUT_S: f64 = 10.0;

/// The run's examples.
pub(crate) struct Sources {
    /// RL prompts: `data.train`, else the task's train split.
    pub train: Arc<Dataset>,
    /// Evaluation problems: `data.eval`; else the task's test split (`eval.size` of them), or
    /// none when `data.train` is given (the task's problems would say nothing about it).
    pub eval: Vec<Example>,
    /// Warm-up demonstrations: `data.sft`, else the task's reference completions.
    pub sft: Option<Dataset>,
    /// The environment: the task's, or single-turn for your own data.
    pub env: Arc<dyn Environment>,
}

impl Sources {
    /// Reads the recipe's files (checking that message prompts can be rendered) or generates
    /// the task's problems.
    pub(crate) fn load(recipe: &Recipe, task: &Task, tokenizer: &Tokenizer) -> Result<Self> {
        let columns = recipe.data.columns();
        let terms = effective_terms(&recipe.data, &recipe.reward);
        // Built once, not per row.
        let by_source: Vec<Option<BySource>> = terms.iter().map(by_source).collect();
        let check = |ex: &Example| check_ground_truth(&terms, &by_source, ex);
        let load = |path: &Path, role| -> Result<Dataset> {
            let d = match role {
                DataRole::Prompts => Dataset::load_checked(path, &columns, role, &check)?,
                DataRole::Demonstrations => Dataset::load(path, &columns, role)?,
            };
            d.check_renderable(tokenizer, path)?;
            Ok(d)
        };
        let own = recipe.data.train.is_some();
        let train = match &recipe.data.train {
            Some(p) => load(p, DataRole::Prompts)?,
            None => Dataset {
                examples: task.examples(Split::Train, 4096),
            },
        };
        let eval = match &recipe.data.eval {
            Some(p) => load(p, DataRole::Prompts)?.examples,
            None if own => Vec::new(),
            None => task.examples(Split::Test, recipe.eval.size),
        };
        let sft = recipe
            .data
            .sft
            .as_deref()
            .map(|p| load(p, DataRole::Demonstrations))
            .transpose()?;
        let env: Arc<dyn Environment> = if !recipe.tool.is_empty() {
            Arc::new(tool_env(&recipe.tool)?)
        } else if own {
            Arc::new(SingleTurn)
        } else {
            task.environment()
        };
        Ok(Self {
            train: Arc::new(train),
            eval,
            sft,
            env,
        })
    }
}

/// Longest tool output when a `[[tool]]` gives none.
pub const DEFAULT_TOOL_OUTPUT: usize = 512;

/// The environment of the recipe's `[[tool]]`s. Its per-call deadline covers the slowest tool's
/// own (a command's kill is what stops its process).
fn tool_env(tools: &[ToolSpec]) -> Result<ToolEnv> {
    let mut env = ToolEnv::new();
    let mut longest = Duration::ZERO;
    let mut cap = 0;
    for (i, t) in tools.iter().enumerate() {
        let out = t.max_output_bytes.unwrap_or(DEFAULT_TOOL_OUTPUT);
        cap = cap.max(out);
        env =
            match t.kind {
                ToolKind::Calculator => {
                    longest = longest.max(Duration::from_secs_f64(t.timeout_s.unwrap_or(2.0)));
                    env.with_tool(NamedTool {
                        name: t.name().to_string(),
                        tool: Calculator,
                    })
                }
                ToolKind::Command => {
                    let timeout =
                        Duration::from_secs_f64(t.timeout_s.unwrap_or(DEFAULT_COMMAND_TIMEOUT_S));
                    longest = longest.max(timeout);
                    let argv = t.command.clone().unwrap_or_default();
                    env.with_tool(CommandTool::new(t.name(), argv, timeout, out).map_err(|e| {
                        TrainError::Recipe(format!("tool[{i}] ({}): {e}", t.name()))
                    })?)
                }
            };
    }
    Ok(env
        .with_timeout(longest + Duration::from_secs(1))
        .with_max_output(cap))
}

/// The run's rewards and the name of the term that defines accuracy: the recipe's `[[reward]]`
/// terms when given (for own data without any, `by_source`), else the task's verifier
/// (`correct`); `extra` terms (a library user's) are added either way.
pub(crate) fn rewards(
    recipe: &Recipe,
    task: &Task,
    extra: &[(f64, Arc<dyn Reward>)],
) -> Result<(RewardSet, String)> {
    let terms = effective_terms(&recipe.data, &recipe.reward);
    let (mut set, correct) = if terms.is_empty() {
        (task.rewards(), "correct".to_string())
    } else {
        let mut set = RewardSet::new();
        let mut longest = Duration::ZERO;
        for (i, t) in terms.iter().enumerate() {
            if let Some(c) = command_timeout(t) {
                longest = longest.max(c);
            }
            let inner = term(t, recipe.rollout.max_new_tokens)
                .map_err(|e| TrainError::Recipe(format!("reward[{i}] ({}): {e}", t.name())))?;
            set = set.with_arc(
                t.weight,
                Arc::new(Named {
                    name: t.name().to_string(),
                    inner,
                }),
            );
        }
        // The pool's deadline must not cut a command short of its own: the command's kill is
        // what stops its process.
        if longest + Duration::from_secs(1) > set.timeout {
            set = set.with_timeout(longest + Duration::from_secs(1));
        }
        let i = correctness_term(&terms).ok_or_else(|| {
            TrainError::Recipe("reward: no term defines accuracy (correctness = true)".into())
        })?;
        (set, terms[i].name().to_string())
    };
    for (w, r) in extra {
        set = set.with_arc(*w, r.clone());
    }
    Ok((set, correct))
}

/// The term's [`BySource`] when it is `kind = "by_source"`.
fn by_source(t: &RewardTerm) -> Option<BySource> {
    (t.kind == RewardKind::BySource).then(|| BySource::new(t.sources.clone().unwrap_or_default()))
}

/// Whether every verifying term can score the row: `by_source` (the term's [`BySource`], at
/// the same index) finds a scorer for its `data_source`, and each answer is one the term can
/// match (a term that never could would score every sample of the row 0 without saying why).
fn check_ground_truth(
    terms: &[RewardTerm],
    by_source: &[Option<BySource>],
    ex: &Example,
) -> std::result::Result<(), String> {
    for (t, by_source) in terms.iter().zip(by_source) {
        let (kind, name) = (t.kind.as_str(), t.name());
        // gsm8k compares strings once commas and `$` are gone, `exact` parses numbers.
        let gsm8k = |a: &str| a.replace([',', '$'], "").trim().parse::<f64>().is_ok();
        let exact = |a: &str| parse_number(a).is_some();
        let numeric: Option<&dyn Fn(&str) -> bool> = match (t.kind, by_source) {
            (_, Some(b)) => b
                .scorer(&ex.metadata)
                .map_err(|e| format!("reward term {name:?} ({kind}): {e}"))?
                .is_numeric()
                .then_some(&gsm8k),
            (RewardKind::Gsm8k, _) => Some(&gsm8k),
            (RewardKind::Exact, _) => (t.format.unwrap_or(AnswerFormat::LastNumber)
                == AnswerFormat::LastNumber)
                .then_some(&exact),
            (RewardKind::MathBoxed | RewardKind::MathDapo | RewardKind::QaEm, _) => None,
            _ => continue,
        };
        for answer in ex.answers() {
            if answer.trim().is_empty() {
                return Err(format!(
                    "the answer (ground truth) is empty; reward term {name:?} ({kind}) needs one"
                ));
            }
            if numeric.is_some_and(|parses| !parses(answer)) {
                return Err(format!(
                    "the answer {answer:?} is not a number, and reward term {name:?} ({kind}) \
                     compares numbers; use a text scorer (math_dapo, math_boxed, qa_em, or exact \
                     with format = \"answer_tag\" or \"boxed\")"
                ));
            }
        }
    }
    Ok(())
}

fn command_timeout(t: &RewardTerm) -> Option<Duration> {
    (t.kind == RewardKind::Command)
        .then(|| Duration::from_secs_f64(t.timeout_s.unwrap_or(DEFAULT_COMMAND_TIMEOUT_S)))
}

/// One term's reward function (the recipe was validated: required options are present).
fn term(t: &RewardTerm, max_new_tokens: usize) -> std::result::Result<Arc<dyn Reward>, String> {
    let missing = |k: &str| format!("kind = \"{}\" needs `{k}`", t.kind.as_str());
    Ok(match t.kind {
        RewardKind::Gsm8k => Arc::new(match t.method.unwrap_or(Gsm8kMethod::Strict) {
            Gsm8kMethod::Strict => Scorer::Gsm8kStrict,
            Gsm8kMethod::Flexible => Scorer::Gsm8kFlexible,
        }),
        RewardKind::MathBoxed => Arc::new(Scorer::MathBoxed),
        RewardKind::MathDapo => Arc::new(Scorer::MathDapo),
        RewardKind::QaEm => Arc::new(Scorer::QaEm),
        RewardKind::Exact => Arc::new(ExactMatch::new(
            t.format.unwrap_or(AnswerFormat::LastNumber),
        )),
        RewardKind::Format => Arc::new(FormatReward(t.format.unwrap_or(AnswerFormat::AnswerTag))),
        RewardKind::Regex => {
            let p = t.pattern.as_deref().ok_or_else(|| missing("pattern"))?;
            Arc::new(RegexMatch(regex::Regex::new(p).map_err(|e| e.to_string())?))
        }
        RewardKind::Length => Arc::new(LengthPenalty::new(
            t.target.ok_or_else(|| missing("target"))?,
            t.coef.unwrap_or(1.0),
        )),
        RewardKind::Overlong => Arc::new(OverlongShaping(
            OverlongPenalty::new(
                t.max_len.unwrap_or(max_new_tokens),
                t.cache_len.ok_or_else(|| missing("cache_len"))?,
                t.factor.unwrap_or(1.0),
            )
            .map_err(|e| e.to_string())?,
        )),
        RewardKind::BySource => Arc::new(by_source(t).unwrap_or_default()),
        RewardKind::Command => Arc::new(CommandReward::new(
            t.name(),
            t.command.clone().ok_or_else(|| missing("command"))?,
            command_timeout(t).unwrap_or_default(),
        )?),
    })
}
