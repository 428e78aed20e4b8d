//! Records the commit the tool is built from (`GDN_GIT_COMMIT`, with `+dirty` when the
//! working tree has uncommitted changes) for `gdn bench` records: a benchmark binary is often
//! copied to another machine, where the directory it runs in says nothing about its source.
//! The library has no build script; only this package runs git.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=GDN_GIT_COMMIT");
    // The repository's git directory (not cli/.git, which does not exist: a missing path
    // would rerun this script on every build); a worktree has its own HEAD and index.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for file in ["HEAD", "index"] {
            println!(
                "cargo:rerun-if-changed={}",
                Path::new(&dir).join(file).display()
            );
        }
        // A commit moves the branch's ref, not HEAD (which names the branch).
        if let (Some(common), Some(head_ref)) = (
            git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]),
            git(&["symbolic-ref", "-q", "HEAD"]),
        ) {
            let path = Path::new(&common).join(head_ref);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
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
