//! Probe for PF_RING. Until the `pfring` feature is implemented (the engines issue), this crate
//! is built empty and reports `found=0`, which the top-level build turns into "no PF_RING".
fn main() {
    println!("cargo::rerun-if-env-changed=PFRING_DIR");
    println!("cargo::rerun-if-env-changed=PFRING_INCLUDE_DIR");
    println!("cargo::rerun-if-env-changed=PFRING_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_PFRING").is_some() {
        panic!(
            "the `pfring` feature of pfring-sys is not implemented yet in this version of vgate; \
             build without `--features pfring`"
        );
    }
    println!("cargo::metadata=found=0");
}
