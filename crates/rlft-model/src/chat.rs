//! Chat templates: the Jinja source shipped with a checkpoint, rendered with `minijinja` the way
//! transformers' `apply_chat_template` renders it (trim_blocks, lstrip_blocks, loop controls,
//! Python string methods, `raise_exception`, `bos_token` / `eos_token` in scope).

use crate::{ModelError, Result};
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    source: String,
    env: minijinja::Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        Self::new(&self.source).expect("a template that compiled once compiles again")
    }
}

fn template_error(e: minijinja::Error) -> ModelError {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    ModelError::Template(msg)
}

impl ChatTemplate {
    /// Compiles a Jinja chat template.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(template_error)?;
        Ok(Self {
            source: source.to_string(),
            env,
        })
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String> {
        let tmpl = self.env.get_template("chat").map_err(template_error)?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token.unwrap_or(""),
            eos_token => eos_token.unwrap_or(""),
        })
        .map_err(template_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_python_methods_and_errors() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'system' and not loop.first %}\
             {{ raise_exception('system must be first') }}{% endif %}\
             <|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}\
             {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        )
        .unwrap();
        let msgs = [ChatMessage::user("  What is 2+2? ")];
        assert_eq!(
            t.render(&msgs, true, None, None).unwrap(),
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
        let bad = [ChatMessage::user("a"), ChatMessage::new("system", "b")];
        let err = t.render(&bad, false, None, None).unwrap_err().to_string();
        assert!(err.contains("system must be first"), "{err}");
        assert!(ChatTemplate::new("{% for %}").is_err());
    }
}
