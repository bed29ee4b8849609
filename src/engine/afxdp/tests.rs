use super::*;

#[test]
fn a_worker_sleeping_in_poll_kicks_what_the_poll_would_leave() {
    assert!(!poll_needs_kick(0, false));
    assert!(!poll_needs_kick(0, true));
    assert!(
        !poll_needs_kick(POLL_TX_BUDGET, false),
        "the poll sends these"
    );
    assert!(poll_needs_kick(POLL_TX_BUDGET + 1, false));
    assert!(poll_needs_kick(1, true), "after a kick the device stopped");
}

#[test]
fn numeric_knobs_clamp_and_default() {
    // A name no other test or run sets.
    const K: &str = "VGATE_AFXDP_TEST_KNOB_ZCFIX";
    std::env::remove_var(K);
    assert_eq!(numeric_knob(K, 32, 1, 2048), 32);
    std::env::set_var(K, "64");
    assert_eq!(numeric_knob(K, 32, 1, 2048), 64);
    std::env::set_var(K, "0");
    assert_eq!(numeric_knob(K, 32, 1, 2048), 1);
    std::env::set_var(K, "lots");
    assert_eq!(numeric_knob(K, 32, 1, 2048), 32);
    std::env::remove_var(K);
}

#[test]
fn csum_offload_only_where_the_kernel_honours_it() {
    // 6.18 and later: every driver (the skb-zerocopy path handles metadata too).
    for d in [Some("virtio_net"), Some("veth"), Some("mlx5_core"), None] {
        assert_eq!(csum_offload_verdict(Some("6.18.0"), d), Ok(()));
        assert_eq!(csum_offload_verdict(Some("6.19.2-arch1-1"), d), Ok(()));
        assert_eq!(csum_offload_verdict(Some("7.0.0-rc1"), d), Ok(()));
    }
    // 6.11–6.17: veth only; virtio_net (IFF_TX_SKB_NO_LINEAR) and anything unknown sum in
    // software.
    assert_eq!(csum_offload_verdict(Some("6.11.0"), Some("veth")), Ok(()));
    assert_eq!(
        csum_offload_verdict(Some("6.17.9-fc"), Some("veth")),
        Ok(())
    );
    for d in [Some("virtio_net"), Some("e1000e"), None] {
        let why = csum_offload_verdict(Some("6.17.9"), d).unwrap_err();
        assert!(why.contains("IFF_TX_SKB_NO_LINEAR"), "{why}");
        assert!(csum_offload_verdict(Some("6.12.1"), d).is_err());
    }
    // Before 6.11 copy mode ignores TX metadata, whatever the driver.
    for r in ["6.10.14", "6.8.0-45-generic", "5.15.0"] {
        assert!(csum_offload_verdict(Some(r), Some("veth")).is_err(), "{r}");
    }
    // Unknown or unparsable version: software.
    assert!(csum_offload_verdict(None, Some("veth")).is_err());
    assert!(csum_offload_verdict(Some("garbage"), Some("veth")).is_err());
    assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
    assert_eq!(kernel_version("6"), None);
}

#[test]
fn program_jumps_land_inside_and_the_map_loads_are_pseudo() {
    let fast = FastFds {
        fwd: 9,
        stats: 10,
        devmap: 11,
        max_payload: 1400,
    };
    for with_fast in [None, Some(&fast)] {
        let p = xdp_program(
            7,
            8,
            12,
            &[
                (Ipv4Addr::new(10, 0, 0, 1), 1, 20000, 20999),
                (Ipv4Addr::new(10, 0, 0, 200), 2, 30000, 30999),
            ],
            with_fast,
        );
        for (i, insn) in p.iter().enumerate() {
            let class = insn.code & 0x07;
            if (class == 0x05 || class == 0x06) && insn.code != CALL && insn.code != EXIT {
                let target = i as isize + 1 + insn.off as isize;
                assert!(
                    target > i as isize && (target as usize) < p.len(),
                    "{i}: {insn:?}"
                );
            }
        }
        let maps: Vec<i32> = p
            .iter()
            .filter(|i| i.code == LD_IMM64)
            .map(|i| {
                assert_eq!(i.regs >> 4, PSEUDO_MAP_FD);
                i.imm
            })
            .collect();
        let want = if with_fast.is_some() {
            vec![7, 9, 10, 11, 8, 12]
        } else {
            vec![7, 8, 12]
        };
        assert_eq!(maps, want);
        assert_eq!(p.last().map(|i| i.code), Some(EXIT));
    }
}
