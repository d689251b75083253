//! How each family's `config.json` is read and written: transformers' defaults for missing
//! keys, the two spellings of a setting, and what is refused.

use crate::{LayerType, Result, TransformerConfig};

#[test]
fn accepts_both_rope_theta_spellings() {
    let base = r#"{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,
        "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1"#;
    let a = TransformerConfig::from_hf_json(&format!("{base},\"rope_theta\":1e6}}")).unwrap();
    let b = TransformerConfig::from_hf_json(&format!(
        "{base},\"rope_parameters\":{{\"rope_theta\":1e6,\"rope_type\":\"default\"}}}}"
    ))
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.rope_theta, 1e6);
    assert!(a.attention_bias && a.head_dim == 4);
}

#[test]
fn rejects_bad_configs() {
    let e = TransformerConfig::from_hf_json(r#"{"model_type":"gpt2"}"#).unwrap_err();
    assert!(e.to_string().contains("invalid model config"), "{e}");
    let e = TransformerConfig::from_hf_json(
        r#"{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
        "num_hidden_layers":1,"num_attention_heads":3,"num_key_value_heads":2}"#,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("multiple of num_key_value_heads"),
        "{e}"
    );
}

fn parse(model_type: &str, extra: &str) -> Result<TransformerConfig> {
    TransformerConfig::from_hf_json(&format!(
        r#"{{"model_type":"{model_type}","vocab_size":10,"hidden_size":16,"intermediate_size":24,
        "num_hidden_layers":4,"num_attention_heads":2,"num_key_value_heads":1{extra}}}"#
    ))
}

#[test]
fn missing_keys_take_transformers_class_defaults() {
    let g2 = parse("gemma2", "").unwrap();
    assert_eq!(g2.attn_logit_softcapping, Some(50.0));
    assert_eq!(g2.final_logit_softcapping, Some(30.0));
    assert_eq!(g2.head_dim, 256);
    assert_eq!(g2.sliding_window, Some(4096));
    assert_eq!(g2.attention_multiplier, Some(1.0 / 16.0));
    assert!(g2.tie_word_embeddings && g2.norm_unit_offset);
    assert_eq!(g2.embedding_multiplier, 4.0);
    assert_eq!(
        (0..4).map(|i| g2.layer_type(i)).collect::<Vec<_>>(),
        [
            LayerType::Sliding,
            LayerType::Full,
            LayerType::Sliding,
            LayerType::Full
        ]
    );
    let off = parse(
        "gemma2",
        r#","attn_logit_softcapping":null,"final_logit_softcapping":null"#,
    )
    .unwrap();
    assert_eq!(off.attn_logit_softcapping, None);
    assert_eq!(off.final_logit_softcapping, None);
    let g3 = parse("gemma3_text", r#","attn_logit_softcapping":1.0"#).unwrap();
    assert_eq!(g3.attn_logit_softcapping, None, "Gemma 3 ignores it");
    assert_eq!((g3.rope_theta, g3.rope_local_theta), (1e6, Some(1e4)));
    let q = parse("qwen3_moe", r#","num_experts":16"#).unwrap();
    let m = q.moe.as_ref().unwrap();
    assert!(!m.norm_topk_prob && m.decoder_sparse_step == 1 && m.experts_per_token == 8);
    let granite = parse("granite", "").unwrap();
    assert_eq!(
        granite.attention_multiplier,
        Some(1.0),
        "scale 1, not 1/sqrt(d)"
    );
    let mixtral = parse("mixtral", "").unwrap();
    assert_eq!(mixtral.rope_theta, 1e6);
    assert_eq!(mixtral.moe.unwrap().experts_per_token, 2);
    assert_eq!(parse("olmo2", "").unwrap().rms_norm_eps, 1e-5);
}

#[test]
fn two_spellings_that_disagree_are_refused_naming_both() {
    for (family, keys, names) in [
        (
            "qwen3_moe",
            r#","num_experts":8,"num_local_experts":4"#,
            ["'num_experts' (8)", "'num_local_experts' (4)"],
        ),
        (
            "mixtral",
            r#","num_experts":8,"num_local_experts":4"#,
            ["'num_local_experts' (4)", "'num_experts' (8)"],
        ),
        (
            "llama",
            r#","rope_theta":10000.0,"rope_parameters":{"rope_theta":500000.0}"#,
            ["'rope_theta'", "'rope_parameters.rope_theta'"],
        ),
        (
            "phi3",
            r#","partial_rotary_factor":0.5,"rope_parameters":{"partial_rotary_factor":0.75}"#,
            [
                "'partial_rotary_factor'",
                "'rope_parameters.partial_rotary_factor'",
            ],
        ),
        (
            "gemma3_text",
            r#","head_dim":8,"sliding_window_pattern":3,"_sliding_window_pattern":6"#,
            ["'sliding_window_pattern'", "'_sliding_window_pattern'"],
        ),
        (
            "gemma3_text",
            r#","head_dim":8,"rope_local_base_freq":1e4,
            "rope_parameters":{"full_attention":{"rope_theta":1e6},
            "sliding_attention":{"rope_theta":2e4}}"#,
            [
                "'rope_parameters.sliding_attention.rope_theta'",
                "'rope_local_base_freq'",
            ],
        ),
        (
            "llama",
            r#","rope_parameters":{"rope_type":"linear","factor":2.0},
            "rope_scaling":{"rope_type":"linear","factor":4.0}"#,
            ["'rope_parameters'", "'rope_scaling'"],
        ),
    ] {
        let e = parse(family, keys).unwrap_err().to_string();
        for n in names {
            assert!(e.contains(n), "{family} {keys}: {e}");
        }
        assert!(e.contains("disagree"), "{e}");
    }
    // Both spellings with one value are one setting.
    let both = parse("qwen3_moe", r#","num_experts":16,"num_local_experts":16"#).unwrap();
    assert_eq!(both.moe.unwrap().num_experts, 16);
    let both = parse(
        "llama",
        r#","rope_theta":5e5,"rope_parameters":{"rope_theta":5e5,"rope_type":"default"}"#,
    )
    .unwrap();
    assert_eq!(both.rope_theta, 5e5);
}

#[test]
fn both_spellings_read_the_same() {
    let hub = parse(
        "gemma3_text",
        r#","head_dim":8,"rope_theta":1e6,"rope_local_base_freq":1e4,
        "rope_scaling":{"rope_type":"linear","factor":8.0},"sliding_window":6,
        "sliding_window_pattern":3"#,
    )
    .unwrap();
    let v5 = parse(
        "gemma3_text",
        r#","head_dim":8,"sliding_window":6,
        "layer_types":["sliding_attention","sliding_attention","full_attention","sliding_attention"],
        "rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":1e6},
        "sliding_attention":{"rope_type":"default","rope_theta":1e4}}"#,
    )
    .unwrap();
    assert_eq!(hub.layer_types, v5.layer_types);
    assert_eq!(hub, v5);
    assert_eq!(hub.rope_linear_factor, Some(8.0));
    let a = parse("qwen3_moe", r#","num_experts":8"#).unwrap();
    let b = parse("qwen3_moe", r#","num_local_experts":8"#).unwrap();
    assert_eq!(a, b);
    let a = parse("phi3", r#","partial_rotary_factor":0.5"#).unwrap();
    let b = parse(
        "phi3",
        r#","rope_parameters":{"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":0.5}"#,
    )
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.rotary_dim(), 4);
    assert_eq!(a.inv_freq().len(), 2);
    // Written back and read again, every family keeps its settings.
    for cfg in [
        hub,
        a,
        parse("granite", r#","logits_scaling":2.0"#).unwrap(),
    ] {
        let again = TransformerConfig::from_hf_json(&cfg.to_hf_json().to_string()).unwrap();
        assert_eq!(again, cfg);
    }
}

#[test]
fn unsupported_settings_are_errors_that_say_so() {
    let e = parse(
        "phi3",
        r#","rope_scaling":{"type":"longrope","short_factor":[1.0],"long_factor":[1.0]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("longrope") && e.contains("not supported"), "{e}");
    let e = parse("qwen2", r#","use_sliding_window":true"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("use_sliding_window"), "{e}");
    let e = parse("mixtral", r#","num_experts_per_tok":9"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = parse("gemma2", r#","layer_types":["sliding_attention"]"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer_types"), "{e}");
    let e = parse("gemma2", r#","hidden_activation":"relu""#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("relu"), "{e}");
}
