//! `rlft serve` as a separate process, for the tests that drive it over loopback HTTP
//! (`serve.rs`, `rollout_servers.rs`, `server_faults.rs`, `serve_hostile.rs`): started on a
//! free port with the tests' API key ([`crate::cli::TEST_KEY`], which the trainers these tests
//! start read from `RLFT_API_KEY`), killed when dropped, also when its test fails.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A running `rlft serve`, killed on drop.
pub struct Serve {
    pub child: Child,
    pub url: String,
    pub agent: ureq::Agent,
    pub key: Option<String>,
}

impl Serve {
    /// With the tests' key, unless `extra` gives a key of its own (then with none set here).
    pub fn start(model: &Path, extra: &[&str]) -> Self {
        Self::start_env(model, extra, &[])
    }

    /// As [`Serve::start`], with `env` set for the server; a key in `env` (`RLFT_API_KEY`)
    /// replaces the tests' key (and none is set here).
    pub fn start_env(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let own = extra
            .iter()
            .any(|a| a.starts_with("--api-key") || *a == "--insecure-no-key")
            || env.iter().any(|(k, _)| *k == "RLFT_API_KEY");
        if own {
            return Self::launch(model, extra, env, None);
        }
        let mut args = extra.to_vec();
        args.extend(["--api-key", crate::cli::TEST_KEY]);
        Self::launch(model, &args, env, Some(crate::cli::TEST_KEY))
    }

    /// Without a key.
    pub fn start_keyless(model: &Path, extra: &[&str]) -> Self {
        Self::launch(model, extra, &[], None)
    }

    fn launch(model: &Path, extra: &[&str], env: &[(&str, &str)], key: Option<&str>) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlft"));
        cmd.arg("serve")
            .arg(model)
            .args(["--port", "0", "--device", "flex"])
            .args(extra)
            .env_remove("RLFT_API_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        // The first line names the address; a server that never gets there fails the test.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(120)) else {
            let _ = child.kill();
            panic!("rlft serve printed no address within 120 s");
        };
        let url = match line.split(" on ").last().map(str::trim) {
            Some(u) if u.starts_with("http://127.0.0.1:") => u.to_string(),
            _ => {
                let _ = child.kill();
                panic!("no address in the first line {line:?}");
            }
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(120)))
            .build()
            .into();
        Self {
            child,
            url,
            agent,
            key: key.map(String::from),
        }
    }

    /// POSTs `body` (a JSON value, or raw text) to `path`; the status and the JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let mut req = self.agent.post(format!("{}{path}", self.url));
        if let Some(k) = &self.key {
            req = req.header("Authorization", &format!("Bearer {k}"));
        }
        let r = match body {
            Value::String(raw) => req.content_type("application/json").send(raw.as_str()),
            v => req.send_json(v),
        };
        Self::answer(r)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let mut req = self.agent.get(format!("{}{path}", self.url));
        if let Some(k) = &self.key {
            req = req.header("Authorization", &format!("Bearer {k}"));
        }
        let mut r = req.call().unwrap();
        let status = r.status().as_u16();
        (status, r.body_mut().read_to_string().unwrap())
    }

    pub fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Value) {
        let mut r = r.unwrap();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v)
    }

    /// A completion that must succeed.
    pub fn complete(&self, body: Value) -> Value {
        let (status, v) = self.post("/v1/completions", &body);
        assert_eq!(status, 200, "{v}");
        v
    }
}

impl Serve {
    /// `rlft_requests_in_flight` from `/metrics` (0 when the server does not answer).
    pub fn in_flight(&self) -> u64 {
        let mut req = self.agent.get(format!("{}/metrics", self.url));
        if let Some(k) = &self.key {
            req = req.header("Authorization", &format!("Bearer {k}"));
        }
        let Ok(mut r) = req
            .config()
            .timeout_global(Some(std::time::Duration::from_secs(2)))
            .build()
            .call()
        else {
            return 0;
        };
        let text = r.body_mut().read_to_string().unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("rlft_requests_in_flight "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Sends the process `signal` (`STOP`, `CONT`) with the shell's `kill`.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("sh")
            .arg("-c")
            .arg(format!("kill -{signal} {}", self.child.id()))
            .status()
            .unwrap();
        assert!(ok.success(), "kill -{signal}");
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// A raw connection to the server, reads timing out after 30 s (a test fails instead of
    /// hanging).
    pub fn connect(&self) -> TcpStream {
        let c = TcpStream::connect(("127.0.0.1", self.port())).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        c
    }

    /// Sends a raw request and reads the answer to its end.
    pub fn exchange(&self, req: &str) -> String {
        let mut c = self.connect();
        c.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    /// `Authorization: Bearer <key>` with this server's key.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.key.as_deref().unwrap_or_default())
    }

    /// A counter or gauge from `/metrics`.
    pub fn metric(&self, name: &str) -> u64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} not in {text}"))
    }
}

/// A whole raw HTTP/1.1 request (`Connection: close`; a `Content-Length` for POST).
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut r = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        r.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r
}

/// The status of a raw answer.
pub fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The Python to drive the server with when it has `module` (`$PYTHON`, else `python3`);
/// `None`, with a `skipped:` line, when it has not (CI installs the clients).
pub fn python_with(module: &str) -> Option<String> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let has = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        println!("skipped: {python} has no `{module}` package (pip install {module})");
        return None;
    }
    Some(python)
}
