use super::*;

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(start_paused = true)]
async fn arrivals_go_at_once_to_a_quiet_leader() {
    let mut a = Arrivals::default();
    assert_eq!(a.due(), None);
    a.add(set(&[]), Instant::now());
    assert_eq!(a.due(), None, "nothing arrived");
    a.add(set(&["g/n1", "g/n2"]), Instant::now());
    assert_eq!(a.due(), Some(Instant::now()));
    assert_eq!(a.take(false, Instant::now()), set(&["g/n1", "g/n2"]));
    assert_eq!(a.due(), None);
    assert_eq!(a.take(false, Instant::now()), set(&[]));
}

#[tokio::test(start_paused = true)]
async fn a_busy_leader_is_asked_again_until_the_cap() {
    let mut a = Arrivals::default();
    let t0 = Instant::now();
    a.add(set(&["g/n1"]), t0);
    let mut asked = 0;
    loop {
        let due = a.due().expect("waiting arrivals have a time");
        assert!(due <= t0 + WAIT_MAX, "never past the cap");
        tokio::time::advance(due - Instant::now()).await;
        let now = Instant::now();
        let taken = a.take(true, now);
        if !taken.is_empty() {
            assert_eq!(taken, set(&["g/n1", "g/n2"]), "the later arrival goes too");
            assert_eq!(now, t0 + WAIT_MAX, "a busy leader lets them go at the cap");
            break;
        }
        asked += 1;
        assert_eq!(a.due(), Some((now + RECHECK).min(t0 + WAIT_MAX)));
        a.add(set(&["g/n2"]), now);
    }
    assert_eq!(
        asked as u32,
        WAIT_MAX.as_millis() as u32 / RECHECK.as_millis() as u32
    );
    assert_eq!(a.due(), None, "none left");
}

#[tokio::test(start_paused = true)]
async fn nothing_is_taken_before_the_recheck() {
    let mut a = Arrivals::default();
    a.add(set(&["g/n1"]), Instant::now());
    assert!(a.take(true, Instant::now()).is_empty());
    tokio::time::advance(RECHECK / 2).await;
    assert!(
        a.take(false, Instant::now()).is_empty(),
        "asked again only when due"
    );
    tokio::time::advance(RECHECK / 2).await;
    assert_eq!(a.take(false, Instant::now()), set(&["g/n1"]));
}

#[tokio::test(start_paused = true)]
async fn a_changed_node_leaves_the_arrivals() {
    let mut a = Arrivals::default();
    a.add(set(&["g/n1", "g/n2"]), Instant::now());
    a.remove(&set(&["g/n1"]));
    assert_eq!(a.take(false, Instant::now()), set(&["g/n2"]));
    a.add(set(&["g/n3"]), Instant::now());
    a.remove(&set(&["g/n3"]));
    assert_eq!(a.due(), None, "none left to wait for");
}
