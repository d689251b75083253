//! `report.html` in a real browser: a tiny run is plotted with its report, headless Chromium
//! opens the report (through a page that frames it and counts its images), and every image must
//! have loaded with a non-zero natural width.
//!
//! The test needs a program outside Rust, so it is ignored by default. Run it with
//!
//! ```text
//! apt-get install chromium    # Debian; or point RLFT_CHROMIUM at a Chrome/Chromium binary
//! cargo test --workspace --features ndarray --test report -- --ignored
//! ```
//!
//! `.ci/run` installs Chromium and runs it that way, so CI fails when the browser check fails.

mod common;

use common::root;
use rlft_train::{Recipe, Trainer};
use std::path::PathBuf;
use std::process::Command;

fn chromium() -> PathBuf {
    let candidates = std::env::var_os("RLFT_CHROMIUM")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            [
                "/usr/bin/chromium",
                "/usr/bin/chromium-browser",
                "/usr/bin/google-chrome",
            ]
            .map(PathBuf::from),
        );
    candidates.into_iter().find(|p| p.exists()).unwrap_or_else(|| {
        panic!(
            "headless Chromium is needed for this test: `apt-get install chromium` (Debian), or \
             point RLFT_CHROMIUM at a Chrome/Chromium binary"
        )
    })
}

#[test]
#[ignore = "needs headless Chromium: apt-get install chromium, then run with -- --ignored"]
fn every_image_of_the_report_loads_in_chromium() {
    let run = std::env::temp_dir().join(format!("rlft-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run);
    let sets = common::tiny_lagged_run(&run, 2);
    let recipe = Recipe::load(&root().join("recipes/quickstart.toml"), &sets).unwrap();
    Trainer::new(recipe, None).unwrap().run(None).unwrap();
    let pictures = rlft_train::plot::plot_run(&run, None).unwrap();
    let report = rlft_train::plot::write_report(&run, &pictures).unwrap();
    let pngs = pictures
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .count();
    assert!(pngs > 10, "{pngs} pictures");
    // The report is framed by a page that counts the images once the frame has loaded.
    let page = run.join("check.html");
    std::fs::write(
        &page,
        r#"<!DOCTYPE html><html><body>
<iframe id="r" src="report.html" width="1200" height="800"></iframe>
<pre id="result">not loaded</pre>
<script>
document.getElementById('r').addEventListener('load', () => {
  const imgs = [...document.getElementById('r').contentDocument.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.getElementById('result').textContent = 'images ' + ok + ' of ' + imgs.length;
});
</script></body></html>"#,
    )
    .unwrap();
    let profile = run.join("chromium-profile");
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--allow-file-access-from-files",
            "--virtual-time-budget=15000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let result = dom
        .split("<pre id=\"result\">")
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .unwrap_or_else(|| {
            panic!(
                "no result in Chromium's DOM:\n{dom}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(
        result,
        format!("images {pngs} of {pngs}"),
        "{}",
        report.display()
    );
    std::fs::remove_dir_all(&run).ok();
}
