//! Chat template rendering: the Jinja template stored in the model (GGUF
//! `tokenizer.chat_template`), rendered with minijinja and Python-style
//! string methods, as Hugging Face `apply_chat_template` does.
//!
//! Which template applies is chosen as llama-server does by default: a
//! stored template recognised as ChatML is rendered with the canonical
//! ChatML formatter (so no model-specific default system prompt is
//! injected: SmolLM2's would make the 135M model drift), any other stored
//! template is rendered as written, and models without one get ChatML.
//! `TemplateChoice` lets an operator force the stored template, ChatML,
//! or a template file.

use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;

use crate::error::{EngineError, Result};

/// ChatML, used when the model ships no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Which chat template a model is served with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TemplateChoice {
    /// ChatML for ChatML-family templates, else the stored template.
    #[default]
    Auto,
    /// The template stored in the model file, verbatim.
    Stored,
    /// The built-in ChatML template.
    ChatMl,
    /// A Jinja template file.
    File(std::path::PathBuf),
}

impl std::str::FromStr for TemplateChoice {
    type Err = std::convert::Infallible;

    /// `auto`, `gguf`, `chatml`, or a path to a template file.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s {
            "auto" | "" => Self::Auto,
            "gguf" | "stored" => Self::Stored,
            "chatml" => Self::ChatMl,
            path => Self::File(path.into()),
        })
    }
}

impl TemplateChoice {
    /// The template source to compile, given the model's stored template.
    pub fn resolve(&self, stored: Option<&str>) -> Result<String> {
        Ok(match (self, stored) {
            (Self::File(path), _) => std::fs::read_to_string(path)
                .map_err(|e| EngineError::Load(format!("chat template {}: {e}", path.display())))?,
            (Self::ChatMl, _) | (_, None) => CHATML_TEMPLATE.to_string(),
            (Self::Auto, Some(t)) if t.contains("<|im_start|>") => CHATML_TEMPLATE.to_string(),
            (Self::Auto | Self::Stored, Some(t)) => t.to_string(),
        })
    }
}

/// One chat message, already reduced to plain text content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

fn raise_exception(msg: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are exposed as `bos_token`/`eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| EngineError::Load(format!("chat template does not compile: {e}")))?;
        Ok(Self {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// Renders the conversation, ending with the assistant's turn opener.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| EngineError::Template(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| EngineError::Template(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_renders_messages_and_generation_prompt() {
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "").expect("compiles");
        let out = t
            .render(&[ChatMessage::new("user", "Hi")])
            .expect("renders");
        assert_eq!(
            out,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_string_methods_and_raise_exception_work() {
        let src = "{% if messages[0]['role'] == 'bad' %}{{ raise_exception('roles must alternate') }}{% endif %}{{ messages[0]['content'].strip() }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  x  ")])
                .expect("renders"),
            "x"
        );
        let err = t
            .render(&[ChatMessage::new("bad", "x")])
            .expect_err("raises");
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn auto_uses_chatml_for_chatml_family_templates_only() {
        let smol = "{{ '<|im_start|>system\\nYou are SmolLM<|im_end|>' }}";
        let other = "[INST] {{ messages[0]['content'] }} [/INST]";
        let auto = TemplateChoice::Auto;
        assert_eq!(auto.resolve(Some(smol)).expect("resolves"), CHATML_TEMPLATE);
        assert_eq!(auto.resolve(Some(other)).expect("resolves"), other);
        assert_eq!(auto.resolve(None).expect("resolves"), CHATML_TEMPLATE);
        assert_eq!(
            TemplateChoice::Stored
                .resolve(Some(smol))
                .expect("resolves"),
            smol
        );
        assert_eq!(
            "chatml".parse::<TemplateChoice>(),
            Ok(TemplateChoice::ChatMl)
        );
        assert!(matches!(
            TemplateChoice::File("/nonexistent.jinja".into()).resolve(None),
            Err(EngineError::Load(_))
        ));
    }

    #[test]
    fn a_broken_template_is_a_load_error() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(EngineError::Load(_))
        ));
    }

    /// The stored templates of the families issue 43 added, as their
    /// instruction-tuned files carry them (Gemma 3's folds the system
    /// message into the first user turn and names the assistant `model`;
    /// Phi-3.5's and Phi-4-mini's), render as Hugging Face renders them.
    #[test]
    fn gemma3_and_phi3_stored_templates_render_as_their_models_expect() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/templates");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).expect("template");
        let chat = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", " Hi "),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("user", "Bye"),
        ];
        let gemma = ChatTemplate::new(&read("gemma3.jinja"), "<bos>", "<eos>").expect("compiles");
        assert_eq!(
            gemma.render(&chat).expect("renders"),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        let err = gemma
            .render(&[ChatMessage::new("assistant", "x")])
            .expect_err("roles must alternate");
        assert!(err.to_string().contains("alternate"), "{err}");
        let phi = ChatTemplate::new(&read("phi3.jinja"), "<s>", "<|endoftext|>").expect("compiles");
        assert_eq!(
            phi.render(&chat[..2]).expect("renders"),
            "<|system|>\nBe brief.<|end|>\n<|user|>\n Hi <|end|>\n<|assistant|>\n"
        );
    }
}
