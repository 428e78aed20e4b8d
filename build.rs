//! Records the commit the crate is built from (`GDN_GIT_COMMIT`, with `+dirty` when the
//! working tree has uncommitted changes) for `gdn bench` records: a benchmark binary is often
//! copied to another machine, where the directory it runs in says nothing about its source.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
    println!("cargo:rerun-if-env-changed=GDN_GIT_COMMIT");
    if std::env::var("GDN_GIT_COMMIT").is_ok() {
        return;
    }
    if let Some(head) = git(&["rev-parse", "--short", "HEAD"]) {
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let suffix = if dirty { "+dirty" } else { "" };
        println!("cargo:rustc-env=GDN_GIT_COMMIT={head}{suffix}");
    }
}
