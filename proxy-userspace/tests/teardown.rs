//! What the tests and the demo make, they remove: programs, namespace,
//! cgroup and bpffs.
mod common;

use std::{path::Path, process::Command};

use common::{Env, new_sock_addr_programs, sock_addr_programs, wait_new_sock_addr_programs_gone, web};

/// These tests count the programs loaded in the whole kernel: one at a
/// time, or each would see the others' programs.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn an_environment_leaves_nothing_behind() {
    common::require_root!();
    let _serial = one_at_a_time();
    let before = sock_addr_programs();
    let (ns, cgroup, bpffs) = {
        let mut env = Env::new(1);
        env.write_services(&web(&[1]));
        env.start_agent();
        assert_eq!(
            new_sock_addr_programs(&before).len(),
            8,
            "connect, sendmsg, recvmsg, getpeername for both families"
        );
        (env.ns.path(), env.cgroup.path().to_owned(), env.bpffs.path().to_owned())
    };
    assert_eq!(wait_new_sock_addr_programs_gone(&before), Vec::<u32>::new(), "programs left loaded");
    assert!(!ns.exists(), "namespace left: {}", ns.display());
    assert!(!cgroup.exists(), "cgroup left: {}", cgroup.display());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(&bpffs.display().to_string()), "bpffs left mounted");
}

#[test]
fn the_demo_check_passes_and_cleans_up() {
    common::require_root!();
    let _serial = one_at_a_time();
    let before = sock_addr_programs();
    let out = Command::new(common::AGENT).args(["demo", "--check"]).output().expect("run demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for b in ["backend-1", "backend-2", "backend-3"] {
        assert!(stdout.contains(b), "{stdout}");
    }
    assert!(stdout.contains("nsenter --net=/var/run/netns/ebpf-proxy-demo curl"), "{stdout}");
    assert!(!stdout.contains("sudo"), "a root shell may have no sudo:\n{stdout}");
    assert!(stdout.contains("The command above answered: backend-"), "the printed command works:\n{stdout}");
    assert_eq!(wait_new_sock_addr_programs_gone(&before), Vec::<u32>::new(), "programs left loaded");
    assert!(!Path::new("/var/run/netns/ebpf-proxy-demo").exists());
    assert!(!Path::new("/run/ebpf-proxy-demo").exists());
}

#[test]
fn cleanup_detaches_and_unpins_everything() {
    common::require_root!();
    let _serial = one_at_a_time();
    let before = sock_addr_programs();
    let mut env = Env::new(1);
    env.write_services(&web(&[1]));
    env.start_agent();
    env.agent.take(); // stopped: the datapath stays and still translates
    assert_eq!(env.requests("10.96.0.10", 3), vec!["backend-1"; 3]);

    let out =
        Command::new(common::AGENT).args(["cleanup", "--bpffs-dir"]).arg(env.pin_dir()).output().expect("run cleanup");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!env.pin_dir().exists(), "pin directory left");
    assert_eq!(wait_new_sock_addr_programs_gone(&before), Vec::<u32>::new(), "programs left loaded");
    let (ok, err) = env.socat_connect(true, "10.96.0.10:80");
    assert!(!ok && err.contains("Network is unreachable"), "still translated after cleanup: {err}");
}
