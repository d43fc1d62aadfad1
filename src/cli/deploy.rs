//! `onceflow deploy render`: the Kubernetes manifests of one job per topology.

use std::path::PathBuf;

use clap::Subcommand;

use crate::deploy::{self, RenderOptions};
use crate::load;
use crate::topology::env::Strictness;

#[derive(Subcommand)]
pub enum DeployCommand {
    /// Write the manifests of a topology's job: a StatefulSet (pod name = instance id), a
    /// ConfigMap with the topology and its schema files, a headless and a metrics Service, a
    /// PodDisruptionBudget. Variables the topology uses come from the Secret `<job>-env`.
    /// With `--values`, the values of the Helm chart deploy/helm/onceflow that make them.
    Render {
        /// The topology file.
        topology: PathBuf,
        /// Instances of the job.
        #[arg(long, default_value_t = 3)]
        replicas: u32,
        /// The onceflow image.
        #[arg(long, default_value = "onceflow:latest")]
        image: String,
        /// The namespace of every object (default: none, the one kubectl applies to).
        #[arg(long)]
        namespace: Option<String>,
        /// The brokers the pods connect to.
        #[arg(long, default_value = "kafka:9092")]
        bootstrap_servers: String,
        /// Write the values of the Helm chart deploy/helm/onceflow for this topology instead
        /// of manifests (the chart makes the same objects from them; replicas, image,
        /// namespace and brokers are the chart's values then).
        #[arg(long, conflicts_with_all = ["replicas", "image", "namespace", "bootstrap_servers"])]
        values: bool,
        /// Write here instead of standard output.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
}

pub fn run(command: DeployCommand) -> anyhow::Result<bool> {
    let DeployCommand::Render {
        topology: path,
        replicas,
        image,
        namespace,
        bootstrap_servers,
        values,
        out,
    } = command;
    // Variables are the pods' business: unset ones here expand to their defaults.
    let checked = load::load(&path, Strictness::Lenient);
    let Some(topology) = checked.topology.filter(|_| checked.diagnostics.is_empty()) else {
        for d in &checked.diagnostics {
            eprintln!("{d}");
        }
        anyhow::bail!("{} does not validate", path.display());
    };
    let text = std::fs::read_to_string(&path)?;
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("topology.yaml")
        .to_string();
    let dir = path.parent().map(PathBuf::from).unwrap_or_default();
    let mut files = Vec::new();
    for f in deploy::schema_files(&topology) {
        let content = std::fs::read_to_string(dir.join(&f))
            .map_err(|e| anyhow::anyhow!("cannot read {f}: {e}"))?;
        files.push((f, content));
    }
    let yaml = if values {
        let values = deploy::chart_values(&topology, &file_name, &text, &files)
            .map_err(anyhow::Error::msg)?;
        let command = format!("onceflow deploy render {} --values", path.display());
        deploy::values_to_yaml(&values, &command).map_err(anyhow::Error::msg)?
    } else {
        let options = RenderOptions {
            replicas,
            image,
            namespace,
            bootstrap_servers,
        };
        let documents = deploy::render(&topology, &file_name, &text, &files, &options)
            .map_err(anyhow::Error::msg)?;
        let command = format!(
            "onceflow deploy render {} --replicas {replicas}",
            path.display()
        );
        deploy::to_yaml(&documents, &command).map_err(anyhow::Error::msg)?
    };
    match out {
        Some(file) => std::fs::write(file, yaml)?,
        None => print!("{yaml}"),
    }
    Ok(true)
}
