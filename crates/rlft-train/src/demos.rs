//! The warm-up's demonstrations, tokenised once and bounded by `sft.max_len` (prompt, response
//! and the closing EOS together; by default the model's context length).
//!
//! `data.sft` rows longer than the bound are skipped when the run starts (verl's
//! `filter_overlong_prompts` does the same for prompts): first by their length in bytes — a row
//! longer than the bound times the tokenizer's longest vocabulary entry needs more tokens than
//! the bound and is skipped without being tokenised, so a huge row costs its text and nothing
//! more —, then by their token count. `sft/skipped` reports how many. The built-in task's
//! reference completions are short by construction; one past the bound is an error naming the
//! setting, never a silent cut.

use crate::{Result, TrainError};
use rlft_model::Tokenizer;
use rlft_rollout::Dataset;
use std::path::Path;

/// One demonstration: the prompt's ids, the response's ids (the closing EOS included) and the
/// response's loss mask (0 on tool observations).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Demo {
    pub(crate) prompt: Vec<u32>,
    pub(crate) response: Vec<u32>,
    pub(crate) mask: Vec<f32>,
}

impl Demo {
    /// The demonstration of `prompt` answered by `turns` (text, whether it is an observation),
    /// closed by `eos`; `None` when it would be longer than `max_len` tokens. A text too long in
    /// bytes to fit is not tokenised.
    pub(crate) fn encode(
        tokenizer: &Tokenizer,
        prompt: &str,
        turns: &[(String, bool)],
        eos: u32,
        max_len: usize,
    ) -> Result<Option<Self>> {
        let bytes = prompt.len() + turns.iter().map(|(t, _)| t.len()).sum::<usize>();
        if tokenizer.surely_longer_than(bytes, max_len) {
            return Ok(None);
        }
        let prompt = tokenizer.encode(prompt)?;
        let mut response = Vec::new();
        let mut mask = Vec::new();
        for (text, observation) in turns {
            let ids = tokenizer.encode(text)?;
            mask.extend(std::iter::repeat_n(
                if *observation { 0.0 } else { 1.0 },
                ids.len(),
            ));
            response.extend(ids);
        }
        response.push(eos);
        mask.push(1.0);
        if prompt.len() + response.len() > max_len {
            return Ok(None);
        }
        Ok(Some(Self {
            prompt,
            response,
            mask,
        }))
    }
}

/// `data.sft`'s demonstrations that fit `sft.max_len`, in file order.
#[derive(Debug)]
pub(crate) struct Demos {
    pub(crate) rows: Vec<Demo>,
    /// Rows of the file longer than the bound.
    pub(crate) skipped: usize,
}

impl Demos {
    /// Tokenises the demonstrations of `set` (read from `path`), skipping those longer than
    /// `max_len` tokens.
    ///
    /// # Errors
    /// A prompt that cannot be rendered or tokenised; a file none of whose rows fits.
    pub(crate) fn new(
        set: &Dataset,
        path: &Path,
        tokenizer: &Tokenizer,
        max_len: usize,
    ) -> Result<Self> {
        let eos = eos(tokenizer);
        let mut rows = Vec::with_capacity(set.len());
        let mut skipped = 0;
        for ex in &set.examples {
            let turns = [(ex.completion.clone().unwrap_or_default(), false)];
            match Demo::encode(
                tokenizer,
                &ex.prompt.render(tokenizer)?,
                &turns,
                eos,
                max_len,
            )? {
                Some(d) => rows.push(d),
                None => skipped += 1,
            }
        }
        if rows.is_empty() {
            return Err(TrainError::Recipe(format!(
                "data.sft: every one of the {} demonstrations of {} is longer than sft.max_len = \
                 {max_len} tokens (prompt, completion and EOS); raise sft.max_len (at most the \
                 model's context length) or shorten the rows",
                set.len(),
                path.display()
            )));
        }
        if skipped > 0 {
            eprintln!(
                "note: data.sft: {skipped} of {} demonstrations of {} are longer than sft.max_len \
                 = {max_len} tokens and are skipped (sft/skipped)",
                set.len(),
                path.display()
            );
        }
        Ok(Self { rows, skipped })
    }
}

/// The token that closes a demonstration.
pub(crate) fn eos(tokenizer: &Tokenizer) -> u32 {
    tokenizer.eos_ids.first().copied().unwrap_or(0)
}

/// `sft.max_len` as the run applies it: the recipe's, else the model's context length.
///
/// # Errors
/// A bound longer than the model's context.
pub(crate) fn max_len(recipe_max_len: Option<usize>, context: usize) -> Result<usize> {
    match recipe_max_len {
        None => Ok(context),
        Some(m) if m > context => Err(TrainError::Recipe(format!(
            "sft.max_len: {m} tokens is longer than the model's context length \
             (max_position_embeddings = {context}); set it to at most {context}, or leave it out \
             for the context length"
        ))),
        Some(m) => Ok(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlft_rollout::{Example, Prompt};

    fn example(prompt: &str, completion: &str) -> Example {
        Example {
            prompt: Prompt::Text(prompt.into()),
            answer: String::new(),
            alternatives: Vec::new(),
            completion: Some(completion.into()),
            metadata: serde_json::Value::Null,
        }
    }

    #[test]
    fn rows_past_the_bound_are_skipped_and_counted() {
        let t = Tokenizer::byte_level();
        let set = Dataset {
            examples: vec![
                example("1+1=", "2"),
                example("2+2=", &"4".repeat(100)),
                example(&"9".repeat(10_000_000), "1"),
                example("3+3=", "6"),
            ],
        };
        let d = Demos::new(&set, Path::new("d.jsonl"), &t, 16).unwrap();
        assert_eq!(d.skipped, 2);
        assert_eq!(d.rows.len(), 2);
        let first = &d.rows[0];
        assert_eq!(first.prompt, t.encode("1+1=").unwrap());
        assert_eq!(first.response.last(), Some(&eos(&t)));
        assert_eq!(first.mask.len(), first.response.len());
        // The bound counts the prompt, the response and the EOS: a row of exactly 16 fits.
        let exact = Demo::encode(&t, "0123456789", &[("abcde".into(), false)], 0, 16).unwrap();
        assert!(exact.is_some_and(|d| d.prompt.len() + d.response.len() == 16));
        let over = Demo::encode(&t, "0123456789", &[("abcdef".into(), false)], 0, 16).unwrap();
        assert!(over.is_none());
    }

    #[test]
    fn observations_are_masked_and_a_file_with_no_fitting_row_is_refused() {
        let t = Tokenizer::byte_level();
        let d = Demo::encode(&t, "q", &[("a".into(), false), ("obs".into(), true)], 0, 64)
            .unwrap()
            .unwrap();
        let obs = t.encode("obs").unwrap().len();
        assert_eq!(
            &d.mask[d.mask.len() - 1 - obs..d.mask.len() - 1],
            vec![0.0; obs]
        );
        let set = Dataset {
            examples: vec![example("a long prompt", "a long answer")],
        };
        let e = Demos::new(&set, Path::new("x.jsonl"), &t, 4).unwrap_err();
        assert!(e.to_string().contains("sft.max_len"), "{e}");
        assert!(max_len(Some(5000), 4096).is_err());
        assert_eq!(max_len(None, 4096).unwrap(), 4096);
        assert_eq!(max_len(Some(512), 4096).unwrap(), 512);
    }
}
