//! How long fjall takes to open a state folder: the part of a restart that comes before the
//! changelog's tail is read (docs/state.md, "Where the state lives").
//!
//! ```text
//! cargo run --release --example store_open -- open DIR             # time opening DIR (3 copies)
//! cargo run --release --example store_open -- write DIR [flushed]   # then: open DIR
//! ```
//!
//! `open` copies DIR (a job's `<state_dir>/<topology>/<instance id>`, e.g. the one
//! `benches/state-restore` keeps in `target/state-restore/state.after-kill/restore/r-0`)
//! three times and opens each copy as the job does, printing the time each open took.
//! `write` writes into a fresh DIR what that benchmark's job writes (1,000,000 keys over 8
//! keyspaces in batches of 2,000, then 100,000 updates; with `flushed`, every memtable
//! flushed between the two), then aborts without closing, as a SIGKILL would.
use std::path::{Path, PathBuf};
use std::time::Instant;

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["open", dir] => open_copies(Path::new(dir)),
        ["write", dir] => write(Path::new(dir), false),
        ["write", dir, "flushed"] => write(Path::new(dir), true),
        _ => Err("usage: store_open open DIR | store_open write DIR [flushed]".into()),
    }
}

/// Opens three copies of `dir`, each as a job does after a SIGKILL (a copy: an open writes).
fn open_copies(dir: &Path) -> Result<(), Error> {
    for round in 1..=3 {
        let copy = PathBuf::from(format!("{}.open-{round}", dir.display()));
        let _ = std::fs::remove_dir_all(&copy);
        copy_dir(dir, &copy)?;
        let started = Instant::now();
        let db = fjall::Database::builder(&copy)
            .cache_size(64 * 1024 * 1024)
            .open()?;
        println!(
            "open {round}: {:.3} s ({} keyspaces)",
            started.elapsed().as_secs_f64(),
            db.keyspace_count()
        );
        drop(db);
        std::fs::remove_dir_all(&copy)?;
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Writes a store as the benchmark's job does, then aborts (no close, no journal sync).
fn write(dir: &Path, flushed: bool) -> Result<(), Error> {
    let _ = std::fs::remove_dir_all(dir);
    let db = fjall::Database::builder(dir)
        .cache_size(64 * 1024 * 1024)
        .open()?;
    let keyspaces = (0..8)
        .map(|p| {
            db.keyspace(&format!("s0-p{p}"), || {
                fjall::KeyspaceCreateOptions::default().max_memtable_size(8 * 1024 * 1024)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let put = |from: u64, to: u64| -> Result<(), Error> {
        let mut n = from;
        while n < to {
            let mut batch = db.batch().durability(Some(fjall::PersistMode::Buffer));
            for i in n..(n + 2_000).min(to) {
                let key = format!("k{}", i % 1_000_000);
                batch.insert(&keyspaces[(i % 8) as usize], key, i.to_string());
            }
            batch.commit()?;
            n += 2_000;
        }
        Ok(())
    };
    put(0, 1_000_000)?;
    if flushed {
        for k in &keyspaces {
            k.rotate_memtable_and_wait()?;
        }
    }
    put(1_000_000, 1_100_000)?;
    db.persist(fjall::PersistMode::Buffer)?;
    eprintln!("written; aborting as a SIGKILL would");
    std::process::abort()
}
