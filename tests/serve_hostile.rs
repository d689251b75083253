//! `rlft serve` against clients that stall, cut their uploads short, post from another origin,
//! rebind a name onto loopback, or swap weights without a key; and weights that are not finite.
//! Raw requests over real sockets on loopback; every server started here is killed when its test
//! ends, also on failure.

#[path = "support/cli.rs"]
mod cli;

#[path = "support/serve.rs"]
mod serve;

use cli::{Scratch, check_all, tiny_llama};
use serde_json::{Value, json};
use serve::{Serve, request, status};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn stalled_clients_neither_block_the_server_nor_stay_connected() {
    let s = Serve::start(
        &tiny_llama(),
        &["--header-timeout", "3", "--body-timeout", "3"],
    );
    let auth = s.bearer();
    let started = Instant::now();
    let mut stalled: Vec<(TcpStream, bool)> = Vec::new();
    for _ in 0..4 {
        let mut c = s.connect();
        c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
            .unwrap();
        stalled.push((c, false));
    }
    for _ in 0..4 {
        let mut c = s.connect();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {auth}\r\n\
             Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
        );
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(&[b' '; 50]).unwrap();
        stalled.push((c, true));
    }
    std::thread::sleep(Duration::from_millis(300));
    // Served alongside them at once: the stalled bodies hold no slot.
    let t = Instant::now();
    s.complete(json!({"prompt": "Hello", "max_tokens": 4}));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a request beside 8 stalled clients took {:?}",
        t.elapsed()
    );
    // Each stalled connection is closed by the server within its timeout (3 s, with slack
    // for a loaded machine); a stalled body is told why.
    let mut failed = Vec::new();
    for (i, (mut c, mid_body)) in stalled.into_iter().enumerate() {
        let mut answer = String::new();
        let read = c.read_to_string(&mut answer);
        let waited = started.elapsed();
        if read.is_err()
            && !matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset)
        {
            failed.push(format!(
                "connection {i}: not closed ({read:?}) after {waited:?}"
            ));
        } else if waited > Duration::from_secs(8) {
            failed.push(format!("connection {i}: closed only after {waited:?}"));
        } else if mid_body && (status(&answer) != 408 || !answer.contains("--body-timeout")) {
            failed.push(format!("connection {i}: answered {answer:?}"));
        }
    }
    check_all(8, &failed);
    assert!(s.metric("rlft_connections_timed_out_total") >= 8);
    s.complete(json!({"prompt": "still serving", "max_tokens": 2}));
}

#[test]
fn a_body_cut_short_is_a_400_that_says_so() {
    let s = Serve::start(&tiny_llama(), &[]);
    let mut c = s.connect();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {}\r\n\
         Content-Type: application/json\r\nContent-Length: 200\r\n\r\n",
        s.bearer()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&[b' '; 50]).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    assert_eq!(status(&answer), 400, "{answer}");
    assert!(
        answer.contains("cut short") && answer.contains("50 of 200"),
        "{answer}"
    );
    // Past the limit is still a 413, at once from Content-Length.
    let big = Serve::start(&tiny_llama(), &["--max-body-bytes", "100"]);
    let auth = big.bearer();
    let req = request(
        "POST",
        "/v1/completions",
        &[
            ("Host", "127.0.0.1"),
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        &format!("{{\"prompt\": \"{}\"}}", "x".repeat(200)),
    );
    assert_eq!(status(&big.exchange(&req)), 413);
}

#[test]
fn ctrl_c_stops_the_server_while_clients_stall() {
    let mut s = Serve::start(&tiny_llama(), &[]);
    let mut mid_headers = s.connect();
    mid_headers
        .write_all(b"GET /v1/models HTTP/1.1\r\nHo")
        .unwrap();
    let mut mid_body = s.connect();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {}\r\n\
         Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{{\"prompt\"",
        s.bearer()
    );
    mid_body.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    s.signal("INT");
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "rlft serve still running 8 s after Ctrl-C with stalled clients"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    println!("stopped {:?} after Ctrl-C", t.elapsed());
}

#[test]
fn no_keyless_weight_swap_cross_origin_post_or_rebinding_gets_through() {
    let tmp = Scratch::new();
    let s = Serve::start_keyless(&tiny_llama(), &[]);
    let port = s.port().to_string();
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let update = json!({"model_path": tiny_llama(), "weight_version": 3}).to_string();
    let host = format!("127.0.0.1:{port}");
    let json_ct = ("Content-Type", "application/json");
    let mut failed = Vec::new();
    let mut check = |what: &str, req: String, want: u16, says: &str| {
        let answer = s.exchange(&req);
        if status(&answer) != want || !answer.contains(says) {
            failed.push(format!("{what}: want {want} naming {says:?}, got {answer}"));
        }
    };
    check(
        "update without a key",
        request(
            "POST",
            "/update_weights_from_disk",
            &[("Host", &host), json_ct],
            &update,
        ),
        403,
        "--api-key",
    );
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    ] {
        check(
            &format!("completions as {ct}"),
            request(
                "POST",
                "/v1/completions",
                &[("Host", &host), ("Content-Type", ct)],
                &body,
            ),
            415,
            "application/json",
        );
    }
    check(
        "no content type",
        request("POST", "/v1/completions", &[("Host", &host)], &body),
        415,
        "application/json",
    );
    for ct in [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
    ] {
        check(
            &format!("completions as {ct}"),
            request(
                "POST",
                "/v1/completions",
                &[("Host", &host), ("Content-Type", ct)],
                &body,
            ),
            200,
            "text_completion",
        );
    }
    for h in [
        "localhost",
        &format!("localhost:{port}"),
        &format!("[::1]:{port}"),
        &host,
    ] {
        check(
            &format!("Host {h}"),
            request("GET", "/v1/models", &[("Host", h)], ""),
            200,
            "policy",
        );
    }
    for h in [
        "evil.example",
        &format!("evil.example:{port}"),
        "127.0.0.2",
        "attacker.localhost",
    ] {
        check(
            &format!("Host {h}"),
            request("POST", "/v1/completions", &[("Host", h), json_ct], &body),
            421,
            "--allowed-hosts",
        );
    }
    check(
        "no Host",
        request("GET", "/v1/models", &[], ""),
        421,
        "Host",
    );
    check_all(17, &failed);
    let (_, models) = s.get("/v1/models");
    assert!(models.contains("\"weight_version\":0"), "{models}");

    // --allowed-hosts widens the names; --api-key-file keeps the key out of the process list.
    let key_file = tmp.file("key", "  from-a-file \n");
    let wide = Serve::start_env(
        &tiny_llama(),
        &[
            "--allowed-hosts",
            "trainer.lan",
            "--api-key-file",
            &key_file,
        ],
        &[],
    );
    let auth = ("Authorization", "Bearer from-a-file");
    let answer = wide.exchange(&request(
        "GET",
        "/v1/models",
        &[("Host", "trainer.lan:9"), auth],
        "",
    ));
    assert_eq!(status(&answer), 200, "{answer}");
    let answer = wide.exchange(&request(
        "GET",
        "/v1/models",
        &[("Host", "other.lan"), auth],
        "",
    ));
    assert_eq!(status(&answer), 421, "{answer}");
    let answer = wide.exchange(&request(
        "GET",
        "/v1/models",
        &[
            ("Host", "localhost"),
            ("Authorization", "Bearer from-a-fil"),
        ],
        "",
    ));
    assert_eq!(status(&answer), 401, "{answer}");
}

#[test]
fn a_non_loopback_host_without_a_key_exits_2_before_binding() {
    let o = Command::new(env!("CARGO_BIN_EXE_rlft"))
        .arg("serve")
        .arg(tiny_llama())
        .args(["--host", "0.0.0.0", "--port", "0", "--device", "flex"])
        .env_remove("RLFT_API_KEY")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--api-key") && err.contains("--insecure-no-key"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "it printed an address: {:?}", o.stdout);
}

/// A copy of the tiny Llama with one NaN and one +inf in `model.layers.1.mlp.down_proj.weight`.
fn poisoned(tmp: &Scratch) -> std::path::PathBuf {
    let dir = tmp.copy_dir(&tiny_llama(), "poisoned");
    let f = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header["model.layers.1.mlp.down_proj.weight"];
    assert_eq!(t["dtype"], "F32");
    let at = 8 + n + t["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[at + 4..at + 8].copy_from_slice(&f32::NAN.to_le_bytes());
    bytes[at + 40..at + 44].copy_from_slice(&f32::INFINITY.to_le_bytes());
    std::fs::write(&f, bytes).unwrap();
    dir
}

#[test]
fn weights_that_are_not_finite_are_refused_and_never_served() {
    let tmp = Scratch::new();
    let bad = poisoned(&tmp);
    let s = Serve::start(&tiny_llama(), &[]);
    let ask = json!({"prompt": [1, 17, 42], "max_tokens": 6, "seed": 7});
    let before = s.complete(ask.clone());
    let (status, v) = s.post(
        "/update_weights_from_disk",
        &json!({"model_path": bad, "weight_version": 1}),
    );
    assert_eq!(status, 400, "{v}");
    let msg = v["message"].as_str().unwrap();
    assert!(
        msg.contains("layers.1.mlp.down_proj.weight") && msg.contains("1 NaN and 1 infinite"),
        "{msg}"
    );
    assert!(msg.contains("version 0 keeps serving"), "{msg}");
    assert_eq!(s.complete(ask.clone())["choices"], before["choices"]);

    // Loaded any other way (here: at start), the sampler meets the non-finite logits and the
    // request is a 500 naming them, never a 200 with null log-probs.
    let served = Serve::start(&bad, &[]);
    let (status, v) = served.post("/v1/completions", &ask);
    assert_eq!(status, 500, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("non-finite logit"), "{msg}");
    let mut streamed = ask.clone();
    streamed["stream"] = true.into();
    let (status, v) = served.post("/v1/completions", &streamed);
    assert_eq!(status, 200, "{v}");
    let text = v.as_str().unwrap_or_default();
    assert!(
        text.contains("non-finite logit") && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
}
