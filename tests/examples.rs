//! Every topology of `topologies/` is validated (as `onceflow validate` does) and run over its
//! cases file `topologies/cases/<name>.yaml` (as `onceflow test` does). No broker needed.

use std::path::{Path, PathBuf};

use onceflow::load;
use onceflow::testing;
use onceflow::topology::env::Strictness;

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("topologies/")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.ends_with(".yaml")
        })
        .collect();
    files.sort();
    files
}

fn cases_of(topology: &Path) -> PathBuf {
    let name = topology.file_name().expect("a file name");
    topology
        .parent()
        .expect("topologies/")
        .join("cases")
        .join(name)
}

#[test]
fn there_are_examples_and_each_has_cases() {
    let files = examples();
    assert!(files.len() >= 5, "{files:?}");
    for f in &files {
        assert!(cases_of(f).exists(), "{} has no cases file", f.display());
    }
}

#[test]
fn every_example_validates_and_passes_its_cases() {
    let mut failures = Vec::new();
    for file in examples() {
        // Strict, with an empty environment: every variable of an example has a default.
        let checked = load::load_text(
            &std::fs::read_to_string(&file).expect("read"),
            &file.display().to_string(),
            &|_| None,
            Strictness::Strict,
        );
        let (topology, pipeline) = match checked.into_result() {
            Ok(ok) => ok,
            Err(diagnostics) => {
                failures.extend(diagnostics.iter().map(ToString::to_string));
                continue;
            }
        };
        let cases = match testing::load_cases(&cases_of(&file)) {
            Ok(c) => c,
            Err(e) => {
                failures.push(e.to_string());
                continue;
            }
        };
        assert!(!cases.cases.is_empty(), "{} has no case", file.display());
        for report in testing::run_cases(&topology, &pipeline, &cases) {
            if !report.passed() {
                failures.push(format!(
                    "{}: {}\n{}",
                    file.display(),
                    report.name,
                    report.mismatches.join("\n")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_cli_validates_and_tests_an_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = env!("CARGO_BIN_EXE_onceflow");
    let out = std::process::Command::new(bin)
        .arg("validate")
        .args(examples())
        .output()
        .expect("run validate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let topology = root.join("topologies/orders.yaml");
    let out = std::process::Command::new(bin)
        .arg("test")
        .arg(&topology)
        .arg("--cases")
        .arg(cases_of(&topology))
        .output()
        .expect("run test");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A mismatch is shown as a diff, with a non-zero exit.
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = dir.path().join("wrong.cases.yaml");
    std::fs::write(
        &cases,
        "cases:\n  - name: wrong\n    input: [{value: {order_id: 9, status: paid}}]\n    expect:\n      paid: [{key: \"8\"}]\n",
    )
    .expect("write");
    let out = std::process::Command::new(bin)
        .arg("test")
        .arg(&topology)
        .arg("--cases")
        .arg(&cases)
        .output()
        .expect("run test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains(r#"- {"key":"8"}"#), "{stdout}");
    assert!(stdout.contains(r#"+ {"headers""#), "{stdout}");

    // Every problem of a broken file, each with its line and path, and a non-zero exit.
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "name: t\ninputs: [{topic: '${ONCEFLOW_TEST_SURELY_UNSET}', codec: json}]\npipeline:\n  - filter: 'value.a >'\noutputs: [{topic: out}]\nkafka: {common: {enable.auto.commit: 'true'}}\n",
    )
    .expect("write");
    let out = std::process::Command::new(bin)
        .arg("validate")
        .arg(&broken)
        .output()
        .expect("run validate");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    for expected in [
        ":2: inputs[0].topic: environment variable ONCEFLOW_TEST_SURELY_UNSET",
        ":4: pipeline[0].filter: ",
        ":6: kafka.common.enable.auto.commit: ",
        "3 problem(s)",
    ] {
        assert!(stdout.contains(expected), "{expected} not in\n{stdout}");
    }
    // --no-env: unset variables are not errors.
    let out = std::process::Command::new(bin)
        .args(["validate", "--no-env"])
        .arg(&broken)
        .output()
        .expect("run validate");
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 problem(s)"));
}

#[test]
fn the_kubernetes_example_is_what_deploy_render_makes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rendered = std::process::Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .current_dir(root)
        .args([
            "deploy",
            "render",
            "topologies/orders.yaml",
            "--replicas",
            "3",
        ])
        .output()
        .expect("deploy render");
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let committed = std::fs::read_to_string(root.join("deploy/k8s/orders.yaml")).expect("read");
    assert_eq!(
        String::from_utf8_lossy(&rendered.stdout),
        committed,
        "deploy/k8s/orders.yaml is not what `onceflow deploy render topologies/orders.yaml` makes: render it again"
    );
}
