//! Which `Host` headers a server answers to ([`HostCheck`]), and which addresses are loopback.

/// Host names a loopback server answers to (each with or without `:port`).
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Which `Host` headers a server accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostCheck {
    /// Any (a non-loopback bind without `allowed_hosts`, or `*` among them).
    Any,
    /// These names, lower-case, without the port.
    Only(Vec<String>),
}

impl HostCheck {
    /// The check for a server bound to `host` with `allowed` extra names.
    pub fn new(host: &str, allowed: &[String]) -> Self {
        if allowed.iter().any(|h| h.trim() == "*") || (!is_loopback(host) && allowed.is_empty()) {
            return Self::Any;
        }
        let names = LOOPBACK_NAMES
            .iter()
            .map(|s| s.to_string())
            .chain(allowed.iter().map(|h| h.trim().to_ascii_lowercase()))
            .collect();
        Self::Only(names)
    }

    /// Whether the `Host` header's value (`name` or `name:port`) is accepted.
    pub fn accepts(&self, value: Option<&str>) -> bool {
        let names = match self {
            Self::Any => return true,
            Self::Only(names) => names,
        };
        let Some(authority) = value.and_then(|v| v.parse::<axum::http::uri::Authority>().ok())
        else {
            return false;
        };
        // `Authority::host` keeps an IPv6 address's brackets.
        let name = authority.host().to_ascii_lowercase();
        names.contains(&name)
    }
}

/// Whether `host` (an address or a name) is a loopback address: `localhost`, 127.0.0.0/8,
/// `::1`.
pub fn is_loopback(host: &str) -> bool {
    let h = host.trim().trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_on_a_loopback_bind() {
        let c = HostCheck::new("127.0.0.1", &[]);
        for ok in [
            "localhost",
            "localhost:8000",
            "127.0.0.1",
            "127.0.0.1:1",
            "[::1]",
            "[::1]:8000",
            "LocalHost:8000",
        ] {
            assert!(c.accepts(Some(ok)), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8000",
            "127.0.0.2",
            "localhost.evil.example",
            "",
            "a b",
        ] {
            assert!(!c.accepts(Some(bad)), "{bad}");
        }
        assert!(!c.accepts(None));
        let wide = HostCheck::new("::1", &["Trainer.lan".into()]);
        assert!(wide.accepts(Some("trainer.lan:8000")));
        assert_eq!(HostCheck::new("0.0.0.0", &[]), HostCheck::Any);
        assert_eq!(HostCheck::new("127.0.0.1", &["*".into()]), HostCheck::Any);
        assert!(HostCheck::new("0.0.0.0", &["a".into()]).accepts(Some("a:1")));
        assert!(!HostCheck::new("0.0.0.0", &["a".into()]).accepts(Some("b:1")));
    }

    #[test]
    fn loopback_addresses() {
        for h in ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["0.0.0.0", "::", "192.168.1.2", "example.com"] {
            assert!(!is_loopback(h), "{h}");
        }
    }
}
