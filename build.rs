//! Turns pfring-sys's "found" metadata into `cfg(vgate_pfring)` so engines can be compiled in
//! or out without every module asking the environment.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(vgate_pfring)");
    println!("cargo::rerun-if-env-changed=DEP_PFRING_FOUND");
    if std::env::var("DEP_PFRING_FOUND").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=vgate_pfring");
    }
}
