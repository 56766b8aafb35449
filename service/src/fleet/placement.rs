//! Where a new session goes: the power of two choices over the engines' free capacity.
//!
//! A pure function over what the fleet last saw of each engine, so it is tested here and costs
//! no engine call: of the engines that may take the session (up, not drained, with the runtime,
//! under their caps), two are drawn at random and the better one wins, an engine that already
//! holds the image first, then the one with more room. Two random choices instead of the
//! emptiest engine keep replicas, which see the same counts, from all piling onto one engine
//! between two counts.

use rand::Rng;
use rand::seq::IndexedRandom;

/// An engine as placement sees it.
#[derive(Debug, Clone)]
pub struct View<'a> {
    pub name: &'a str,
    pub up: bool,
    pub draining: bool,
    /// The runtimes it has; `None` while not known yet (not asked since it came up).
    pub runtimes: Option<&'a [String]>,
    /// Sessions it holds (warm-pool members and placements in flight included).
    pub sessions: u32,
    pub max_sessions: Option<u32>,
    /// Memory its sessions' limits add up to.
    pub memory_used: u64,
    pub memory_bytes: Option<u64>,
    /// It holds the requested image already (no pull).
    pub has_image: bool,
    /// Its warm pool has a member ready for the request (a claim instead of a build).
    pub warm: bool,
}

/// What the session needs.
#[derive(Debug, Clone, Copy)]
pub struct Need<'a> {
    pub runtime: &'a str,
    /// The memory limit each will get (counted against `memory_bytes`).
    pub memory: u64,
    /// How many sessions at once (a fork's `count`; 1 for a create).
    pub count: u32,
}

/// Why no engine could take the session, engine by engine (for the 503's detail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoEngine(pub Vec<String>);

impl std::fmt::Display for NoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no engine can take a session now: {}", self.0.join("; "))
    }
}

/// Why `v` cannot take the session (or `need.count` of them), if it cannot.
pub fn refusal(v: &View<'_>, need: &Need<'_>) -> Option<String> {
    let name = v.name;
    if !v.up {
        return Some(format!("{name} is down"));
    }
    if v.draining {
        return Some(format!("{name} is draining"));
    }
    match v.runtimes {
        None => return Some(format!("{name} has not reported its runtimes yet")),
        Some(r) if !r.iter().any(|r| r == need.runtime) => {
            return Some(format!("{name} has no {} runtime", need.runtime));
        }
        Some(_) => {}
    }
    if let Some(max) = v.max_sessions
        && v.sessions.saturating_add(need.count.max(1)) > max
    {
        return Some(format!(
            "{name} is at capacity ({}/{max} sessions)",
            v.sessions
        ));
    }
    if let Some(total) = v.memory_bytes
        && v.memory_used
            .saturating_add(need.memory.saturating_mul(u64::from(need.count.max(1))))
            > total
    {
        return Some(format!("{name} is at capacity (memory)"));
    }
    None
}

/// The share of `v`'s capacity still free (1 without caps); the tighter cap counts.
fn free(v: &View<'_>, need: &Need<'_>) -> f64 {
    let sessions = v
        .max_sessions
        .map_or(1.0, |max| 1.0 - f64::from(v.sessions) / f64::from(max));
    let memory = v.memory_bytes.map_or(1.0, |total| {
        1.0 - (v.memory_used.saturating_add(need.memory)) as f64 / total as f64
    });
    sessions.min(memory)
}

/// The engine (an index into `views`) the session goes to.
pub fn place(views: &[View<'_>], need: &Need<'_>, rng: &mut impl Rng) -> Result<usize, NoEngine> {
    let mut why = Vec::new();
    let fit: Vec<usize> = views
        .iter()
        .enumerate()
        .filter_map(|(i, v)| match refusal(v, need) {
            Some(r) => {
                why.push(r);
                None
            }
            None => Some(i),
        })
        .collect();
    // A warm member serves a create far faster than any build: engines with one go first.
    let warm: Vec<usize> = fit.iter().copied().filter(|&i| views[i].warm).collect();
    let fit = if warm.is_empty() { fit } else { warm };
    let (a, b) = match fit.len() {
        0 => return Err(NoEngine(why)),
        1 => return Ok(fit[0]),
        _ => {
            let two: Vec<usize> = fit.choose_multiple(rng, 2).copied().collect();
            (two[0], two[1])
        }
    };
    let score = |i: usize| (views[i].has_image, free(&views[i], need));
    let (sa, sb) = (score(a), score(b));
    let better_b = match sb.0.cmp(&sa.0) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => sb.1 > sa.1,
    };
    Ok(if better_b { b } else { a })
}

/// How a pool of `size` members is spread over `views`: each member placed in turn as a session
/// would be, against the counts the members before it added. The draws come from `seed`, so
/// replicas that see the same engines spread a pool the same way.
pub fn spread(views: &[View<'_>], need: &Need<'_>, size: u32, seed: u64) -> Vec<u32> {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut views = views.to_vec();
    let mut shares = vec![0u32; views.len()];
    for _ in 0..size {
        let Ok(i) = place(&views, need, &mut rng) else {
            break;
        };
        shares[i] += 1;
        views[i].sessions += 1;
        views[i].memory_used = views[i].memory_used.saturating_add(need.memory);
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const RUNC: &[String] = &[];

    fn runtimes() -> &'static [String] {
        static R: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        R.get_or_init(|| vec!["runc".to_string()])
    }

    fn view(name: &str, sessions: u32, max: Option<u32>) -> View<'_> {
        View {
            name,
            up: true,
            draining: false,
            runtimes: Some(runtimes()),
            sessions,
            max_sessions: max,
            memory_used: 0,
            memory_bytes: None,
            has_image: false,
            warm: false,
        }
    }

    const NEED: Need<'static> = Need {
        runtime: "runc",
        memory: 0,
        count: 1,
    };

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(7)
    }

    #[test]
    fn only_engines_that_can_take_it_are_chosen() {
        let mut down = view("a", 0, None);
        down.up = false;
        let mut draining = view("b", 0, None);
        draining.draining = true;
        let full = view("c", 5, Some(5));
        let mut no_runtime = view("d", 0, None);
        no_runtime.runtimes = Some(RUNC);
        let ok = view("e", 100, Some(101));
        let views = [down, draining, full, no_runtime, ok];
        for _ in 0..50 {
            assert_eq!(place(&views, &NEED, &mut rng()), Ok(4));
        }
        let err = place(&views[..4], &NEED, &mut rng()).expect_err("an error");
        let text = err.to_string();
        for want in [
            "a is down",
            "b is draining",
            "c is at capacity (5/5 sessions)",
            "d has no runc runtime",
        ] {
            assert!(text.contains(want), "{text}");
        }
    }

    #[test]
    fn memory_caps_count_the_new_session() {
        let mut v = view("a", 0, None);
        v.memory_bytes = Some(1000);
        v.memory_used = 600;
        let need = Need {
            runtime: "runc",
            memory: 500,
            count: 1,
        };
        assert!(place(&[v.clone()], &need, &mut rng()).is_err());
        v.memory_used = 500;
        assert_eq!(place(&[v], &need, &mut rng()), Ok(0));
    }

    #[test]
    fn several_sessions_at_once_must_all_fit() {
        let v = view("a", 1, Some(4));
        let need = |count| Need {
            runtime: "runc",
            memory: 100,
            count,
        };
        assert_eq!(refusal(&v, &need(3)), None);
        assert_eq!(
            refusal(&v, &need(4)).as_deref(),
            Some("a is at capacity (1/4 sessions)")
        );
        let mut m = view("b", 0, None);
        m.memory_bytes = Some(1000);
        assert_eq!(refusal(&m, &need(10)), None);
        assert!(refusal(&m, &need(11)).is_some());
    }

    #[test]
    fn of_two_the_one_with_more_room_wins() {
        // With two engines both are always drawn: the emptier one wins every time.
        let views = [view("a", 9, Some(10)), view("b", 1, Some(10))];
        let mut r = rng();
        for _ in 0..50 {
            assert_eq!(place(&views, &NEED, &mut r), Ok(1));
        }
    }

    #[test]
    fn an_engine_holding_the_image_wins_over_room() {
        let mut a = view("a", 9, Some(10));
        a.has_image = true;
        let views = [a, view("b", 0, Some(10))];
        assert_eq!(place(&views, &NEED, &mut rng()), Ok(0));
    }

    #[test]
    fn an_engine_with_a_warm_member_goes_first() {
        let mut c = view("c", 9, Some(10));
        c.warm = true;
        let views = [view("a", 0, Some(10)), view("b", 0, Some(10)), c];
        let mut r = rng();
        for _ in 0..50 {
            assert_eq!(place(&views, &NEED, &mut r), Ok(2));
        }
    }

    #[test]
    fn many_placements_spread_and_avoid_the_fullest() {
        let views = [
            view("a", 0, Some(100)),
            view("b", 0, Some(100)),
            view("c", 90, Some(100)),
        ];
        let shares = spread(&views, &NEED, 60, 1);
        assert_eq!(shares.iter().sum::<u32>(), 60);
        // The nearly full engine loses every draw it is in.
        assert_eq!(shares[2], 0, "{shares:?}");
        assert!(shares[0] >= 20 && shares[1] >= 20, "{shares:?}");
    }

    #[test]
    fn a_spread_is_the_same_for_the_same_seed_and_stops_at_capacity() {
        let views = [view("a", 0, Some(3)), view("b", 0, Some(3))];
        assert_eq!(spread(&views, &NEED, 4, 9), spread(&views, &NEED, 4, 9));
        assert_eq!(spread(&views, &NEED, 10, 9), vec![3, 3]);
    }
}
