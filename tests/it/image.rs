//! The container image `helm/image/build` makes, built with a real buildah (which
//! `tests/services up` installs) from the hookline binary under test: its config is what the
//! chart in `helm/hookline` expects (the default image name, user and group 65532, the entrypoint
//! the chart's `args` follow, the ports), its one layer holds only the binary, the libraries it
//! links and the user database, and the binary runs inside it as that user: it signs a message
//! exactly as the binary outside does and names the config file `run` was given but cannot read.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::hookline_bin;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a command to completion; one that cannot start fails the test with `hint`.
fn run(program: &str, args: &[&str], hint: &str) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}. {hint}"))
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const NO_BUILDAH: &str = "The image test needs buildah: `tests/run` (through `tests/services up`) \
                          installs it as root with apt-get, or install it yourself \
                          (apt-get install buildah)";

/// buildah on the script's private storage (`helm/image/build buildah ...`), so the test sees
/// the images the script made.
fn buildah(args: &[&str]) -> Output {
    let mut all = vec!["buildah"];
    all.extend_from_slice(args);
    run("helm/image/build", &all, NO_BUILDAH)
}

/// One member of the image archive, as text.
fn member(archive: &Path, name: &str) -> String {
    let archive = archive.to_str().expect("utf-8 path");
    ok(
        run("tar", &["-xOf", archive, name], "tar is needed"),
        &format!("reading {name} from the image archive"),
    )
}

/// A built image: its archive and a working container made from it (both removed on drop).
struct Image {
    archive: PathBuf,
    container: String,
}

impl Image {
    /// Runs the image's hookline with `args` inside a chroot of the image, as `user`.
    ///
    /// buildah's chroot isolation first runs a sealed in-memory copy of itself, and sealing it
    /// can fail with EBUSY while the kernel still holds the copy's pages (seen once in a full
    /// test run, on a loaded machine). That is buildah's step, before hookline starts, so it
    /// is tried again, up to three times in all; any other failure is returned at once.
    fn hookline(&self, user: &str, args: &[&str]) -> Output {
        let mut all = vec![
            "run",
            "--isolation",
            "chroot",
            "--user",
            user,
            &self.container,
            "--",
            "/usr/local/bin/hookline",
        ];
        all.extend_from_slice(args);
        let mut tries = 1;
        loop {
            let out = buildah(&all);
            let busy = String::from_utf8_lossy(&out.stderr)
                .contains("sealing memfd copy: Device or resource busy");
            if !busy || tries == 3 {
                return out;
            }
            tries += 1;
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = buildah(&["rm", &self.container]);
        // The image `buildah from` pulled into the storage, so test runs do not pile up copies.
        let _ = buildah(&["rmi", TAG]);
        let _ = std::fs::remove_file(&self.archive);
    }
}

/// The tag the test's image is built under.
const TAG: &str = "hookline:it";

fn build() -> Image {
    let archive = root().join(format!("target/image/it-{}.tar", std::process::id()));
    let binary = hookline_bin();
    ok(
        run(
            "helm/image/build",
            &[
                "--binary",
                binary,
                "--tag",
                TAG,
                "--output",
                archive.to_str().expect("utf-8 path"),
            ],
            NO_BUILDAH,
        ),
        "helm/image/build",
    );
    let from = format!("docker-archive:{}", archive.display());
    let container = ok(buildah(&["from", "--quiet", &from]), "buildah from")
        .trim()
        .to_owned();
    Image { archive, container }
}

fn values() -> Value {
    let text = std::fs::read_to_string(root().join("helm/hookline/values.yaml")).expect("values");
    serde_yaml_ng::from_str(&text).expect("values.yaml parses")
}

#[test]
fn the_charts_default_image_is_the_one_the_script_tags() {
    let v = values();
    assert_eq!(v["image"]["repository"], "hookline");
    assert_eq!(
        v["image"]["tag"],
        env!("CARGO_PKG_VERSION"),
        "helm/image/build tags hookline:<Cargo.toml version>; values.yaml must name that tag"
    );
}

#[test]
fn the_image_runs_hookline_as_the_charts_user() {
    let image = build();

    // The config: what the chart relies on.
    let manifest: Value =
        serde_json::from_str(&member(&image.archive, "manifest.json")).expect("manifest");
    let manifest = &manifest[0];
    assert_eq!(manifest["RepoTags"][0], "docker.io/library/hookline:it");
    let config: Value = serde_json::from_str(&member(
        &image.archive,
        manifest["Config"].as_str().expect("config name"),
    ))
    .expect("config json");
    let config = &config["config"];
    let v = values();
    let user = format!(
        "{}:{}",
        v["podSecurityContext"]["runAsUser"], v["podSecurityContext"]["runAsGroup"]
    );
    assert_eq!(
        config["User"],
        user.as_str(),
        "the chart's runAsUser:runAsGroup"
    );
    // The chart sets only `args`, so the entrypoint must be the binary.
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/hookline"])
    );
    assert_eq!(
        config["Cmd"],
        serde_json::json!(["run", "--config", "/etc/hookline/hookline.toml"])
    );
    let mut ports: Vec<&str> = config["ExposedPorts"]
        .as_object()
        .expect("exposed ports")
        .keys()
        .map(String::as_str)
        .collect();
    ports.sort_unstable();
    assert_eq!(ports, ["8080/tcp", "9464/tcp"]);
    assert_eq!(
        config["Labels"]["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );

    // The layer: the binary, its libraries, the user database; nothing else.
    let layers = manifest["Layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "one layer: {layers:?}");
    let listing = ok(
        run(
            "sh",
            &[
                "-c",
                &format!(
                    "tar -xOf '{}' '{}' | tar -tvf -",
                    image.archive.display(),
                    layers[0].as_str().expect("layer name")
                ),
            ],
            "sh and tar are needed",
        ),
        "listing the layer",
    );
    let files: Vec<&str> = listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    for f in &files {
        assert!(
            *f == "usr/local/bin/hookline"
                || *f == "etc/passwd"
                || *f == "etc/group"
                || f.contains(".so"),
            "unexpected file {f} in the image:\n{listing}"
        );
    }
    let binary = listing
        .lines()
        .find(|l| l.ends_with(" usr/local/bin/hookline"))
        .unwrap_or_else(|| panic!("no usr/local/bin/hookline in the layer:\n{listing}"));
    assert!(
        binary.starts_with("-rwxr-xr-x root/root") || binary.starts_with("-rwxr-xr-x 0/0"),
        "the binary is root's and executable by everyone: {binary}"
    );
    assert!(
        files.iter().any(|f| f.contains("libc.so")),
        "glibc is in the image:\n{listing}"
    );

    // The binary runs inside, as the image's user, with only what the image holds.
    let sign = [
        "sign",
        "--secret",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "--id",
        "msg_image",
        "--timestamp",
        "1700000000",
        "--body",
        "{\"image\":true}",
    ];
    let outside = ok(
        run(hookline_bin(), &sign, "the test binary"),
        "hookline sign on the host",
    );
    let inside = ok(
        image.hookline(&user, &sign),
        "hookline sign inside the image",
    );
    assert_eq!(
        inside, outside,
        "the image's hookline signs as the host's does"
    );

    let out = image.hookline(&user, &["run", "--config", "/etc/hookline/hookline.toml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "no config in the image: run must fail"
    );
    assert!(
        stderr.contains("/etc/hookline/hookline.toml"),
        "the error names the config file:\n{stderr}"
    );
}
