//! External programs as rewards and tools. [`CommandReward`] keeps long-lived scorer processes
//! (one per reward-pool worker that needs one) that read one JSON object per line on stdin and
//! write one number per line on stdout. [`CommandTool`] starts a program per call, JSON in and
//! text out, with an output cap. A process past its deadline is killed with everything it
//! started (its process group); the sample or the call fails, never the run.

use crate::env::Tool;
use crate::reward::{Reward, RewardInput};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// A running program spoken to line by line; dropping it kills it and its process group.
#[derive(Debug)]
pub struct LineProcess {
    child: Child,
    to_stdin: Option<Sender<String>>,
    from_stdout: Receiver<std::io::Result<String>>,
}

/// Why [`LineProcess::ask`] got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskError {
    /// No line before the deadline (the process has been killed).
    Timeout(Duration),
    /// The process closed its stdout or exited (with its exit status, if known).
    Exited(String),
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout(d) => write!(f, "no answer within {d:?}; the process was killed"),
            Self::Exited(s) => write!(f, "the process exited ({s})"),
        }
    }
}

/// Starts `argv` with piped stdin and stdout (stderr is the trainer's), in a process group of
/// its own on Unix so that [`kill_group`] reaches its children too.
fn spawn_piped(argv: &[String]) -> Result<Child, String> {
    let (program, args) = argv
        .split_first()
        .ok_or("the command is empty: give [\"program\", \"arg\", ...]")?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn()
        .map_err(|e| format!("cannot start {argv:?}: {e}"))
}

/// Kills a child started by [`spawn_piped`] with its process group, and reaps it.
fn kill_group(child: &mut Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: `kill` has no memory effects; the group is the one `spawn_piped` created for
        // this child (its pid), so it reaches nothing else.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl LineProcess {
    /// Starts `argv` with piped stdin and stdout (stderr is the trainer's), in a process group
    /// of its own on Unix so that a kill reaches its children too.
    pub fn spawn(argv: &[String]) -> Result<Self, String> {
        let mut child = spawn_piped(argv)?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            unreachable!("both are piped")
        };
        // Writes and reads run on threads of their own, so a process that stops reading or
        // writing can only make `ask` time out, never block it.
        let (to_stdin, lines) = mpsc::channel::<String>();
        std::thread::Builder::new()
            .name("rlft-command-in".into())
            .spawn(move || {
                for line in lines {
                    if stdin
                        .write_all(line.as_bytes())
                        .and_then(|()| stdin.flush())
                        .is_err()
                    {
                        break;
                    }
                }
            })
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        let (tx, from_stdout) = mpsc::channel();
        std::thread::Builder::new()
            .name("rlft-command-out".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        Ok(Self {
            child,
            to_stdin: Some(to_stdin),
            from_stdout,
        })
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Writes `line` (a newline is added) and waits at most `timeout` for one line back. On a
    /// timeout the process is killed: drop it.
    pub fn ask(&mut self, line: &str, timeout: Duration) -> Result<String, AskError> {
        let sent = self
            .to_stdin
            .as_ref()
            .is_some_and(|tx| tx.send(format!("{line}\n")).is_ok());
        if !sent {
            return Err(AskError::Exited(self.status()));
        }
        match self.from_stdout.recv_timeout(timeout) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(AskError::Exited(format!("reading its output: {e}"))),
            Err(RecvTimeoutError::Disconnected) => Err(AskError::Exited(self.status())),
            Err(RecvTimeoutError::Timeout) => {
                self.kill();
                Err(AskError::Timeout(timeout))
            }
        }
    }

    fn status(&mut self) -> String {
        match self.child.try_wait() {
            Ok(Some(s)) => s.to_string(),
            _ => "it closed its output".into(),
        }
    }

    /// Kills the process and its process group and reaps it.
    pub fn kill(&mut self) {
        self.to_stdin = None;
        kill_group(&mut self.child);
    }
}

impl Drop for LineProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A reward computed by an external program. The program reads one JSON object per line on
/// stdin, `{"prompt", "completion", "ground_truth", "metadata"}` (`ground_truth` a string, or a
/// list of strings when the data gives several acceptable answers), and writes one number per
/// line. Processes are started on demand and reused, at most one per concurrent caller (the
/// reward pool's workers). One that does not answer within `timeout` is killed, with the
/// processes it started, and that sample fails; one that exits or writes something other
/// than a number fails its sample too.
#[derive(Debug)]
pub struct CommandReward {
    name: String,
    argv: Vec<String>,
    timeout: Duration,
    idle: Mutex<Vec<LineProcess>>,
}

impl CommandReward {
    /// A reward named `name` running `argv`, `timeout` per sample. The program is started once
    /// here, so a command that cannot start is an error now rather than a failed sample later.
    pub fn new(
        name: impl Into<String>,
        argv: Vec<String>,
        timeout: Duration,
    ) -> Result<Self, String> {
        let first = LineProcess::spawn(&argv)?;
        Ok(Self {
            name: name.into(),
            argv,
            timeout,
            idle: Mutex::new(vec![first]),
        })
    }

    /// The per-sample deadline.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Processes started and waiting for work.
    pub fn idle_processes(&self) -> Vec<u32> {
        self.lock().iter().map(LineProcess::id).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<LineProcess>> {
        // A panic while holding the lock cannot leave the list inconsistent.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The ground truth a command sees: the answer, or the list of every acceptable answer when
/// there are several.
fn ground_truth(x: &RewardInput) -> serde_json::Value {
    if x.alternatives.is_empty() {
        x.answer.clone().into()
    } else {
        x.answers().into()
    }
}

impl Reward for CommandReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&self, x: &RewardInput) -> Result<f64, String> {
        let taken = self.lock().pop();
        let mut process = match taken {
            Some(p) => p,
            None => LineProcess::spawn(&self.argv)?,
        };
        let line = serde_json::json!({
            "prompt": x.prompt,
            "completion": x.completion,
            "ground_truth": ground_truth(x),
            "metadata": x.metadata,
        })
        .to_string();
        let answer = process
            .ask(&line, self.timeout)
            .map_err(|e| format!("command {:?}: {e}", self.argv))?;
        // The exchange is complete, so the process can serve the next sample even when its
        // answer is unusable.
        self.lock().push(process);
        let v: f64 = answer.trim().parse().map_err(|_| {
            format!(
                "command {:?} wrote {:?}; expected one number per line",
                self.argv,
                answer.chars().take(80).collect::<String>()
            )
        })?;
        Ok(v)
    }
}

/// A tool that runs a program per call: it gets one JSON object on stdin, `{"tool", "args",
/// "metadata", "state"}` (the example's metadata and the episode's earlier calls), and its
/// stdout (trailing newline trimmed) is the observation. Output over `max_output` bytes, a
/// non-zero exit or the deadline fails the call (the process is killed with its group).
#[derive(Debug, Clone)]
pub struct CommandTool {
    name: String,
    argv: Vec<String>,
    timeout: Duration,
    max_output: usize,
}

/// Whether `program` can be started: a path that exists, or a name found on `PATH`.
fn findable(program: &str) -> bool {
    if program.contains(std::path::MAIN_SEPARATOR) || program.contains('/') {
        return std::path::Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

impl CommandTool {
    /// A tool called `name` running `argv`, at most `timeout` and `max_output` bytes per call.
    /// A program that cannot be found is an error now.
    pub fn new(
        name: impl Into<String>,
        argv: Vec<String>,
        timeout: Duration,
        max_output: usize,
    ) -> Result<Self, String> {
        let program = argv
            .first()
            .ok_or("the command is empty: give [\"program\", \"arg\", ...]")?;
        if !findable(program) {
            return Err(format!(
                "cannot start {argv:?}: {program} is not a file or on PATH"
            ));
        }
        Ok(Self {
            name: name.into(),
            argv,
            timeout,
            max_output,
        })
    }

    /// Runs the program on `input` (one JSON line).
    fn run(&self, input: String) -> Result<String, String> {
        let mut child = spawn_piped(&self.argv)?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            unreachable!("both are piped")
        };
        std::thread::spawn(move || {
            let _ = stdin
                .write_all(input.as_bytes())
                .and_then(|()| stdin.write_all(b"\n"));
        });
        let cap = self.max_output;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let r = stdout.take(cap as u64 + 1).read_to_end(&mut out);
            let _ = tx.send(r.map(|_| out));
        });
        let deadline = std::time::Instant::now() + self.timeout;
        let out = match rx.recv_timeout(self.timeout) {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => {
                kill_group(&mut child);
                return Err(format!("reading its output: {e}"));
            }
            Err(_) => {
                kill_group(&mut child);
                return Err(format!(
                    "no output within {:?}; the process was killed",
                    self.timeout
                ));
            }
        };
        if out.len() > cap {
            kill_group(&mut child);
            return Err(format!("output exceeds the {cap}-byte limit"));
        }
        // Its output is complete; it has until the deadline to exit.
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                _ => {
                    kill_group(&mut child);
                    return Err(format!("did not exit within {:?}; killed", self.timeout));
                }
            }
        };
        // Whatever it started in its group goes with it.
        kill_group(&mut child);
        if !status.success() {
            return Err(format!("exited with {status}"));
        }
        let text = String::from_utf8_lossy(&out);
        Ok(text.strip_suffix('\n').unwrap_or(&text).to_string())
    }
}

impl Tool for CommandTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, args: &str) -> Result<String, String> {
        self.call_in_episode(args, &serde_json::Value::Null, &serde_json::Value::Null)
    }

    fn call_in_episode(
        &self,
        args: &str,
        metadata: &serde_json::Value,
        state: &serde_json::Value,
    ) -> Result<String, String> {
        let input = serde_json::json!({
            "tool": self.name, "args": args, "metadata": metadata, "state": state,
        });
        self.run(input.to_string())
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    fn input(c: &str, a: &str) -> RewardInput {
        RewardInput {
            completion: c.into(),
            answer: a.into(),
            ..RewardInput::default()
        }
    }

    /// The pid a test script wrote to `path`.
    fn read_pid(path: &std::path::Path) -> u32 {
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Running (a zombie waiting for its reaper counts as gone).
    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        })
    }

    #[test]
    fn scores_line_by_line_with_one_long_lived_process() {
        // Answers 1 when the completion contains the ground truth; counts its lines in a file
        // of its own to show that one process served every sample.
        let r = CommandReward::new(
            "contains",
            sh(r#"n=0; while read -r l; do n=$((n+1)); case "$l" in *'"completion":"yes'*) echo 1;; *) echo 0;; esac; done"#),
            Duration::from_secs(5),
        )
        .unwrap();
        let pid = r.idle_processes()[0];
        assert_eq!(r.score(&input("yes it is", "x")), Ok(1.0));
        assert_eq!(r.score(&input("no", "x")), Ok(0.0));
        assert_eq!(r.idle_processes(), vec![pid], "the same process is reused");
        drop(r);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!alive(pid), "dropping the reward kills its processes");
    }

    #[test]
    fn a_hanging_scorer_is_killed_with_its_children_and_restarted() {
        // The first line hangs in a child process (sleep); later lines are answered.
        let dir = std::env::temp_dir().join(format!("rlft-cmd-hang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let flag = dir.join("hung-once");
        let pidfile = dir.join("sleep.pid");
        let script = format!(
            "while read -r l; do if [ ! -e {f} ]; then touch {f}; sleep 600 & echo $! > {p}; wait; fi; echo 0.5; done",
            f = flag.display(),
            p = pidfile.display()
        );
        let r = CommandReward::new("hang", sh(&script), Duration::from_millis(300)).unwrap();
        let first = r.idle_processes()[0];
        let t = std::time::Instant::now();
        let e = r.score(&input("a", "b")).unwrap_err();
        assert!(e.contains("no answer within"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(50));
        let sleeper = read_pid(&pidfile);
        assert!(!alive(first), "the scorer was killed");
        assert!(!alive(sleeper), "and so was the child it started");
        assert_eq!(
            r.score(&input("a", "b")),
            Ok(0.5),
            "a fresh process serves the next sample"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_command_tool_gets_json_and_its_output_is_the_observation() {
        let t = CommandTool::new(
            "echo",
            sh(r#"read -r l; case "$l" in *'"args":"2+2"'*'"state":{"calls":[]}'*) echo four ;; *) echo "?$l" ;; esac"#),
            Duration::from_secs(5),
            64,
        )
        .unwrap();
        let state = serde_json::json!({"calls": []});
        assert_eq!(
            t.call_in_episode("2+2", &serde_json::Value::Null, &state),
            Ok("four".into())
        );
        let big = CommandTool::new(
            "big",
            sh("head -c 1000 /dev/zero"),
            Duration::from_secs(5),
            64,
        )
        .unwrap();
        assert!(big.call("").unwrap_err().contains("64-byte limit"));
        let bad = CommandTool::new("bad", sh("exit 2"), Duration::from_secs(5), 64).unwrap();
        assert!(bad.call("").unwrap_err().contains("exited"));
        let e = CommandTool::new(
            "x",
            vec!["/nonexistent/tool".into()],
            Duration::from_secs(1),
            8,
        )
        .unwrap_err();
        assert!(e.contains("is not a file or on PATH"), "{e}");
    }

    #[test]
    fn a_hanging_command_tool_is_killed_at_the_deadline_with_its_children() {
        let dir = std::env::temp_dir().join(format!("rlft-tool-hang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("sleep.pid");
        let t = CommandTool::new(
            "hang",
            sh(&format!(
                "sleep 600 & echo $! > {}; wait",
                pidfile.display()
            )),
            Duration::from_millis(300),
            64,
        )
        .unwrap();
        let start = std::time::Instant::now();
        let e = t.call("").unwrap_err();
        assert!(e.contains("no output within"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(50));
        let sleeper = read_pid(&pidfile);
        assert!(!alive(sleeper), "the child the tool started was killed");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_output_and_exits_fail_the_sample_only() {
        let r = CommandReward::new(
            "words",
            sh("while read -r l; do echo high; done"),
            Duration::from_secs(5),
        )
        .unwrap();
        let e = r.score(&input("a", "b")).unwrap_err();
        assert!(e.contains("expected one number per line"), "{e}");
        let r =
            CommandReward::new("quits", sh("read -r l; exit 3"), Duration::from_secs(5)).unwrap();
        let e = r.score(&input("a", "b")).unwrap_err();
        assert!(e.contains("exited"), "{e}");
        let e = CommandReward::new(
            "missing",
            vec!["/nonexistent/scorer".into()],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(e.contains("cannot start"), "{e}");
        let e = CommandReward::new("empty", vec![], Duration::from_secs(1)).unwrap_err();
        assert!(e.contains("empty"), "{e}");
    }
}
