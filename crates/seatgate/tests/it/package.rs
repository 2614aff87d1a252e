//! The Debian package (`ops/package-deb.sh`, cargo-deb): built, installed with
//! `dpkg -i` on this machine, run from its installed paths, and removed and
//! purged without a trace.
//!
//! It needs root (dpkg). It never starts the service (no systemd is assumed
//! to run), and no other test touches `/usr/bin/seatgate` or `/etc/seatgate`:
//! they run the cargo-built binary (`support::BIN`). It refuses to run where
//! a seatgate package is installed already, which it would purge.
//! `ops/test.sh` builds the package before the suite, so that the release
//! build does not take the CPU from the timing-sensitive tests; here the
//! script then only repackages (seconds). Run alone, this test does the
//! release build itself (minutes on 2 cores) and installs cargo-deb if missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

const UNIT: &str = "/usr/lib/systemd/system/seatgate.service";
const GATEWAY_UNIT: &str = "/usr/lib/systemd/system/seatgate-gateway.service";

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {:?}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// dpkg's status of the seatgate package: "install ok installed",
/// "deinstall ok config-files", or "" when dpkg does not know it.
fn status() -> String {
    let o = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "seatgate"])
        .output()
        .unwrap();
    text(&o.stdout)
}

/// A variable `cargo test` sets for the test binary; not CARGO_HOME,
/// CARGO_TARGET_DIR or other settings of cargo itself.
fn cargo_set_for_tests(name: &str) -> bool {
    name == "CARGO"
        || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_")
        || [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
        ]
        .contains(&name)
}

/// Purges the package if the test stops half-way, so no run leaves it installed.
struct Purge;
impl Drop for Purge {
    fn drop(&mut self) {
        if !status().is_empty() {
            let _ = Command::new("dpkg").args(["--purge", "seatgate"]).output();
        }
    }
}

#[test]
#[ignore = "needs root and dpkg: bash ops/test.sh runs it"]
fn the_deb_installs_runs_from_its_paths_and_purges_cleanly() {
    let uid = text(&run(Command::new("id").arg("-u")).stdout);
    assert_eq!(
        uid.trim(),
        "0",
        "the package test installs a .deb with dpkg: run it as root"
    );
    let before = status();
    assert!(
        before.is_empty() || before.contains("not-installed"),
        "a seatgate package is on this machine ({before}); this test would purge it: `dpkg --purge seatgate` first"
    );
    let root = crate::support::repo_root();
    let root = root.as_path();

    let t = Instant::now();
    let mut script = Command::new("bash");
    script.arg("ops/package-deb.sh").current_dir(root);
    // Without the variables cargo sets for this test (CARGO_MANIFEST_DIR,
    // CARGO_PKG_*, ...): build scripts (ring's) that watch them would see a
    // change, and the release build would start over here and again at the
    // next `ops/package-deb.sh`.
    for (k, _) in std::env::vars().filter(|(k, _)| cargo_set_for_tests(k)) {
        script.env_remove(k);
    }
    let built = run(&mut script);
    let deb = PathBuf::from(text(&built.stdout).trim().lines().last().unwrap_or_default());
    assert!(deb.is_file(), "ops/package-deb.sh printed no package: {built:?}");
    let size = std::fs::metadata(&deb).unwrap().len();
    println!(
        "built {} ({} KiB) in {:.1?}",
        deb.display(),
        size / 1024,
        t.elapsed()
    );

    let info = text(&run(Command::new("dpkg-deb").arg("--field").arg(&deb)).stdout);
    assert!(
        info.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION"))),
        "{info}"
    );
    let depends = info
        .lines()
        .find(|l| l.starts_with("Depends:"))
        .unwrap_or_default();
    assert!(depends.contains("libc6"), "{info}");
    assert!(
        !depends.contains("redis"),
        "Redis may be remote: not a dependency: {info}"
    );
    assert!(info.contains("Suggests: redis-server"), "{info}");

    let _purge = Purge;
    let t = Instant::now();
    run(Command::new("dpkg").arg("-i").arg(&deb));
    println!("installed in {:.1?}", t.elapsed());
    assert_eq!(status(), "install ok installed");

    // The installed binary, from its installed paths.
    let version = text(&run(Command::new("/usr/bin/seatgate").arg("--version")).stdout);
    assert_eq!(version.trim(), format!("seatgate {}", env!("CARGO_PKG_VERSION")));
    let mut check = Command::new("/usr/bin/seatgate");
    check.args(["--config", "/etc/seatgate/seatgate.toml", "check-config"]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SEATGATE__")) {
        check.env_remove(k);
    }
    let checked = text(&run(&mut check).stdout);
    assert_eq!(
        checked.trim(),
        "seatgate: settings OK (/etc/seatgate/seatgate.toml): one Redis, 1 shard(s)"
    );
    // Built without the `tools` feature: no `seatgate bench`.
    let bench = Command::new("/usr/bin/seatgate")
        .args(["bench", "--help"])
        .output()
        .unwrap();
    assert_eq!(bench.status.code(), Some(2), "{bench:?}");

    // What the package holds, where docs/install.md says.
    let same = |installed: &str, source: &str| {
        assert_eq!(
            std::fs::read(installed).unwrap_or_else(|e| panic!("{installed}: {e}")),
            std::fs::read(root.join(source)).unwrap(),
            "{installed} is not {source}"
        );
    };
    same("/etc/seatgate/seatgate.toml", "ops/seatgate.toml");
    same("/usr/share/seatgate/default.toml", "config/default.toml");
    same("/etc/seatgate/seatgate.env", "ops/systemd/seatgate.env");
    same(UNIT, "ops/systemd/seatgate.service");
    same(GATEWAY_UNIT, "ops/systemd/seatgate-gateway.service");
    same("/usr/share/doc/seatgate/gateway.md", "docs/gateway.md");
    same("/usr/share/doc/seatgate/openapi.json", "docs/openapi.json");
    same("/usr/share/seatgate/redis-users.acl", "ops/redis-users.acl");
    same("/usr/share/seatgate/redis.conf", "ops/redis.conf");
    same(
        "/usr/share/seatgate/prometheus/alerts.yml",
        "ops/prometheus/alerts.yml",
    );
    same(
        "/usr/share/seatgate/prometheus/alertmanager.yml",
        "ops/prometheus/alertmanager.yml",
    );
    same(
        "/usr/share/seatgate/grafana/seatgate.json",
        "ops/grafana/seatgate.json",
    );
    same("/usr/share/doc/seatgate/operations.md", "docs/operations.md");
    same("/usr/share/doc/seatgate/README.md", "README.md");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode("/etc/seatgate/seatgate.env"),
        0o600,
        "the env file holds secrets"
    );
    assert_eq!(mode("/usr/bin/seatgate"), 0o755);
    let conffiles = text(&run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "seatgate"])).stdout);
    for f in ["/etc/seatgate/seatgate.toml", "/etc/seatgate/seatgate.env"] {
        assert!(conffiles.contains(f), "{f} is not a conffile: {conffiles}");
    }
    // The installed units pass systemd's own checks, where its tools are.
    if Command::new("systemd-analyze").arg("--version").output().is_ok() {
        for unit in [UNIT, GATEWAY_UNIT] {
            let verify = Command::new("systemd-analyze")
                .args(["verify", unit])
                .output()
                .unwrap();
            assert!(
                verify.status.success() && verify.stderr.is_empty(),
                "{unit}: {verify:?}"
            );
            let security = Command::new("systemd-analyze")
                .args(["security", "--offline=true", unit])
                .output()
                .unwrap();
            let score = text(&security.stdout);
            let score = score
                .lines()
                .find(|l| l.contains("Overall exposure level"))
                .unwrap_or_default();
            println!("{unit}: {}", score.trim());
            assert!(
                score.contains(" OK "),
                "{unit}'s exposure is worse than OK: {security:?}"
            );
        }
    } else {
        println!("systemd-analyze is not installed: the units were not verified");
    }

    // Removed: the binary and the unit go, the settings stay.
    let t = Instant::now();
    run(Command::new("dpkg").args(["-r", "seatgate"]));
    assert_eq!(status(), "deinstall ok config-files");
    for gone in [
        "/usr/bin/seatgate",
        UNIT,
        GATEWAY_UNIT,
        "/usr/share/seatgate",
        "/usr/share/doc/seatgate",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is left after dpkg -r");
    }
    assert!(
        Path::new("/etc/seatgate/seatgate.toml").exists(),
        "dpkg -r keeps the settings"
    );
    // Purged: nothing is left.
    run(Command::new("dpkg").args(["--purge", "seatgate"]));
    println!("removed and purged in {:.1?}", t.elapsed());
    assert!(
        status().is_empty() || status().contains("not-installed"),
        "{}",
        status()
    );
    assert!(
        !Path::new("/etc/seatgate").exists(),
        "/etc/seatgate is left after the purge"
    );
}
