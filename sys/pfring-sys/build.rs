//! Probe for PF_RING's headers and generate the bindings (openssl-sys / libbpf-sys style).
//!
//! Without the `pfring` feature nothing is probed: the crate is built empty and reports
//! `found=0` (`DEP_PFRING_FOUND`), which the top-level build turns into "no PF_RING".
//!
//! With it, the headers are looked for in this order, and the first place that has both
//! `pfring.h` and `linux/pf_ring.h` wins:
//!
//! 1. `PFRING_DIR`: an install prefix (`$PFRING_DIR/include`) or a PF_RING source tree
//!    (`$PFRING_DIR/userland/lib` and `$PFRING_DIR/kernel`);
//! 2. `PFRING_INCLUDE_DIR` (with `PFRING_LIB_DIR` naming where libpfring.so is);
//! 3. `/usr/local/include`, then `/usr/include` (PF_RING installs no pkg-config file).
//!
//! bindgen then writes an allowlisted binding whose functions are loaded from `libpfring.so`
//! at run time (`dynamic_library_name`): the build never links PF_RING, so the binary starts
//! on machines without it and never carries ntop's ZC object. `found=1` is reported.

const ENV: &[&str] = &["PFRING_DIR", "PFRING_INCLUDE_DIR", "PFRING_LIB_DIR"];

fn main() {
    for v in ENV {
        println!("cargo::rerun-if-env-changed={v}");
    }
    // The feature reaches the build script as a cfg (cargo compiles it with the package's
    // features), so a build without it does not even compile the bindgen half.
    #[cfg(feature = "pfring")]
    bind::generate();
    #[cfg(not(feature = "pfring"))]
    println!("cargo::metadata=found=0");
}

#[cfg(feature = "pfring")]
mod bind {
    use std::env;
    use std::path::{Path, PathBuf};

    /// Where the headers are: `pfring.h` in `pfring`, `linux/pf_ring.h` under `kernel`.
    pub struct Headers {
        pub pfring: PathBuf,
        pub kernel: PathBuf,
        /// Where libpfring.so was said or found to be (informational: it is never linked).
        pub lib: Option<PathBuf>,
        pub from: &'static str,
    }

    fn has_headers(pfring: &Path, kernel: &Path) -> bool {
        pfring.join("pfring.h").is_file() && kernel.join("linux/pf_ring.h").is_file()
    }

    fn var(name: &str) -> Option<PathBuf> {
        env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }

    pub fn find() -> Option<Headers> {
        if let Some(dir) = var("PFRING_DIR") {
            let include = dir.join("include");
            if has_headers(&include, &include) {
                return Some(Headers {
                    pfring: include.clone(),
                    kernel: include,
                    lib: Some(dir.join("lib")),
                    from: "PFRING_DIR (install prefix)",
                });
            }
            let (lib, kernel) = (dir.join("userland/lib"), dir.join("kernel"));
            if has_headers(&lib, &kernel) {
                return Some(Headers {
                    pfring: lib.clone(),
                    kernel,
                    lib: Some(lib),
                    from: "PFRING_DIR (source tree)",
                });
            }
            // An explicit PFRING_DIR that does not have them is an error, not a reason to
            // pick up some other PF_RING from the system.
            return None;
        }
        if let Some(inc) = var("PFRING_INCLUDE_DIR") {
            return has_headers(&inc, &inc).then(|| Headers {
                pfring: inc.clone(),
                kernel: inc,
                lib: var("PFRING_LIB_DIR"),
                from: "PFRING_INCLUDE_DIR",
            });
        }
        for prefix in ["/usr/local", "/usr"] {
            let inc = Path::new(prefix).join("include");
            if has_headers(&inc, &inc) {
                return Some(Headers {
                    pfring: inc.clone(),
                    kernel: inc,
                    lib: var("PFRING_LIB_DIR").or_else(|| Some(Path::new(prefix).join("lib"))),
                    from: if prefix == "/usr" {
                        "/usr"
                    } else {
                        "/usr/local"
                    },
                });
            }
        }
        None
    }

    pub fn generate() {
        let Some(h) = find() else {
            panic!(
                "the `pfring` feature needs PF_RING's headers (pfring.h and linux/pf_ring.h) and \
                 none were found: set PFRING_DIR=/path/to/PF_RING (a source tree or an install \
                 prefix), or PFRING_INCLUDE_DIR, or install PF_RING's userland library and \
                 kernel headers under /usr/local or /usr"
            );
        };
        for p in [&h.pfring, &h.kernel] {
            println!("cargo::rerun-if-changed={}", p.display());
        }
        println!(
            "cargo::rerun-if-changed={}",
            h.pfring.join("pfring.h").display()
        );
        println!(
            "cargo::rerun-if-changed={}",
            h.kernel.join("linux/pf_ring.h").display()
        );

        let bindings = bindgen::Builder::default()
            .header(h.pfring.join("pfring.h").to_string_lossy())
            .clang_arg(format!("-I{}", h.pfring.display()))
            .clang_arg(format!("-I{}", h.kernel.display()))
            // Only what the safe wrapper uses: every function listed here must be exported by
            // libpfring.so, or loading it fails (dynamic_link_require_all).
            .allowlist_function(
                "pfring_(open|close|enable_ring|set_direction|set_socket_mode|\
                 set_poll_watermark|set_poll_duration|set_application_name|set_bpf_filter|\
                 recv|send|flush_tx_packets|stats|get_num_rx_channels|get_selectable_fd|poll|version)",
            )
            .allowlist_type("pfring|pfring_stat|pfring_pkthdr|packet_direction|socket_mode")
            .allowlist_var(
                "PKT_FLAGS_CHECKSUM_OK|\
                 PF_RING_(PROMISC|ZC_SYMMETRIC_RSS|LONG_HEADER|DO_NOT_PARSE|DO_NOT_TIMESTAMP|\
                 ERROR_[A-Z_]+)|RING_VERSION_NUM",
            )
            // The ring's inner layout is the library's business, not ours.
            .opaque_type("__pfring")
            .constified_enum_module("packet_direction|socket_mode")
            .derive_default(true)
            .layout_tests(true)
            .wrap_unsafe_ops(true)
            .dynamic_library_name("PfRing")
            .dynamic_link_require_all(true)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
            .generate()
            .unwrap_or_else(|e| {
                panic!(
                    "bindgen could not read PF_RING's headers found through {} ({}, {}): {e}",
                    h.from,
                    h.pfring.display(),
                    h.kernel.display()
                )
            });
        let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        bindings
            .write_to_file(out.join("bindings.rs"))
            .expect("write bindings.rs to OUT_DIR");

        println!("cargo::metadata=found=1");
        println!("cargo::metadata=include={}", h.pfring.display());
        if let Some(lib) = &h.lib {
            // Informational only: the library is loaded at run time, never linked.
            println!("cargo::metadata=lib_dir={}", lib.display());
        }
    }
}
