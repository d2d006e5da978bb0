//! Tells the tests, at build time, whether real data and real checkpoints are configured, so that
//! those needing them are reported by cargo as ignored, with the reason, instead of passing
//! silently (libtest decides what is ignored before a test runs). The roots are found as the
//! program finds them: `BENIGN_DATA_DIR`, else a dataset folder under `./datasets`;
//! `BENIGN_MODELS_DIR`. With `BENIGN_REQUIRE_DATA=1` (CI) nothing is ignored: a missing root
//! fails the test instead.

use std::path::Path;

fn set(variable: &str) -> bool {
    std::env::var_os(variable).is_some_and(|v| !v.is_empty())
}

fn main() {
    for variable in [
        "BENIGN_DATA_DIR",
        "BENIGN_MODELS_DIR",
        "BENIGN_REQUIRE_DATA",
    ] {
        println!("cargo::rerun-if-env-changed={variable}");
    }
    println!("cargo::rerun-if-changed=datasets");
    println!("cargo::rustc-check-cfg=cfg(benign_no_data)");
    println!("cargo::rustc-check-cfg=cfg(benign_no_models)");
    let required = std::env::var("BENIGN_REQUIRE_DATA").is_ok_and(|v| !v.is_empty() && v != "0");
    if required {
        return;
    }
    let default_root_holds_data = std::fs::read_dir(Path::new("datasets"))
        .map(|entries| entries.flatten().any(|e| e.path().is_dir()))
        .unwrap_or(false);
    if !set("BENIGN_DATA_DIR") && !default_root_holds_data {
        println!("cargo::rustc-cfg=benign_no_data");
    }
    if !set("BENIGN_MODELS_DIR") {
        println!("cargo::rustc-cfg=benign_no_models");
    }
}
