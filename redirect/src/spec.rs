//! What the capture is made of: [`CaptureSpec`] (ports, marks, routing
//! table, probe sources) and [`CaptureMode`], checked for consistency. A
//! leaf below everything that builds, applies or verifies the rule set.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::error::RedirectError;

/// How inbound traffic is steered to the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureMode {
    /// Inbound TPROXY (no NAT, the listener needs `IP_TRANSPARENT`),
    /// outbound nat REDIRECT.
    #[default]
    Tproxy,
    /// Inbound and outbound nat REDIRECT (the fallback for odd kernels/CNIs).
    Redirect,
}

/// Everything that parameterises the rule set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureSpec {
    /// Steering mode.
    pub mode: CaptureMode,
    /// Outbound listener port in the pod (app -> anywhere).
    pub outbound_port: u16,
    /// Inbound plaintext listener port in the pod (peer -> app).
    pub inbound_port: u16,
    /// Inbound tunnel (HBONE) port: never captured.
    pub tunnel_port: u16,
    /// Mark on the proxy's own sockets: packets carrying it are never captured.
    pub proxy_mark: u32,
    /// Connmark/fwmark for spoofed-source replies and loopback delivery.
    pub capture_mark: u32,
    /// Mask applied to both marks before comparing.
    pub mark_mask: u32,
    /// Policy routing table holding the local default routes.
    pub route_table: u32,
    /// Priority of the `fwmark` ip rule (before main's 32766).
    pub rule_priority: u32,
    /// Source of kubelet probes (SNATed by the node): never captured.
    pub probe_source_v4: Ipv4Addr,
    /// IPv6 source of kubelet probes: never captured.
    pub probe_source_v6: Ipv6Addr,
}

impl Default for CaptureSpec {
    fn default() -> Self {
        CaptureSpec {
            mode: CaptureMode::Tproxy,
            outbound_port: 15001,
            inbound_port: 15006,
            tunnel_port: 15008,
            proxy_mark: 0x539,
            capture_mark: 0x111,
            mark_mask: 0xfff,
            route_table: 133,
            rule_priority: 100,
            probe_source_v4: Ipv4Addr::new(169, 254, 7, 127),
            probe_source_v6: Ipv6Addr::new(
                0xfd16, 0x9254, 0x7127, 0x1337, 0xffff, 0xffff, 0xffff, 0xffff,
            ),
        }
    }
}

impl CaptureSpec {
    /// Checks that the spec is self-consistent.
    pub fn validate(&self) -> Result<(), RedirectError> {
        let bad = |m: String| Err(RedirectError::InvalidSpec(m));
        let ports = [
            ("outbound_port", self.outbound_port),
            ("inbound_port", self.inbound_port),
            ("tunnel_port", self.tunnel_port),
        ];
        for (i, (n, p)) in ports.iter().enumerate() {
            if *p == 0 {
                return bad(format!("{n} is 0"));
            }
            for (m, q) in &ports[i + 1..] {
                if p == q {
                    return bad(format!("{n} and {m} are both {p}"));
                }
            }
        }
        if self.mark_mask == 0 {
            return bad("mark_mask is 0".into());
        }
        for (n, m) in [
            ("proxy_mark", self.proxy_mark),
            ("capture_mark", self.capture_mark),
        ] {
            if m == 0 || m & self.mark_mask != m {
                return bad(format!(
                    "{n} {m:#x} must be non-zero and inside mark_mask {:#x}",
                    self.mark_mask
                ));
            }
        }
        if self.proxy_mark == self.capture_mark {
            return bad(format!(
                "proxy_mark and capture_mark are both {:#x}",
                self.proxy_mark
            ));
        }
        // 0 is unspec; 253, 254, 255 are default, main and local.
        if matches!(self.route_table, 0 | 253..=255) {
            return bad(format!(
                "route_table {} is reserved (0 unspec, 253 default, 254 main, 255 local)",
                self.route_table
            ));
        }
        if !(1..32766).contains(&self.rule_priority) {
            return bad(format!(
                "rule_priority {} must be in 1..=32765 (before the main table's 32766)",
                self.rule_priority
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_spec_is_valid_and_as_documented() {
        let s = CaptureSpec::default();
        s.validate().unwrap();
        assert_eq!(s.mode, CaptureMode::Tproxy);
        assert_eq!(
            (s.outbound_port, s.inbound_port, s.tunnel_port),
            (15001, 15006, 15008)
        );
        assert_eq!(
            (s.proxy_mark, s.capture_mark, s.mark_mask),
            (0x539, 0x111, 0xfff)
        );
        assert_eq!((s.route_table, s.rule_priority), (133, 100));
        assert_eq!(
            s.probe_source_v6.to_string(),
            "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"
        );
    }

    #[test]
    fn invalid_specs_are_named() {
        let cases: Vec<(CaptureSpec, &str)> = vec![
            (
                CaptureSpec {
                    inbound_port: 15001,
                    ..Default::default()
                },
                "outbound_port and inbound_port are both 15001",
            ),
            (
                CaptureSpec {
                    proxy_mark: 0x1539,
                    ..Default::default()
                },
                "proxy_mark 0x1539 must be non-zero and inside mark_mask 0xfff",
            ),
            (
                CaptureSpec {
                    capture_mark: 0x539,
                    ..Default::default()
                },
                "proxy_mark and capture_mark are both 0x539",
            ),
            (
                CaptureSpec {
                    route_table: 254,
                    ..Default::default()
                },
                "route_table 254 is reserved",
            ),
            (
                CaptureSpec {
                    rule_priority: 32766,
                    ..Default::default()
                },
                "rule_priority 32766",
            ),
        ];
        for (s, want) in cases {
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e} should contain {want}");
        }
    }
}
