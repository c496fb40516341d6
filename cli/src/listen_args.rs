//! The listener's flags, shared by every command that serves a Connector through
//! `ConnectorServer::serve` (`webchat`, `homie`): one definition, one set of names.

use clap::Args;
use xagent_server_runtime::ops::{IpNet, ServeLimits, parse_trusted_proxy};

/// Connection limits of the HTTP listener (SECURITY.md, "The listener").
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Listener connection limits")]
pub struct ListenArgs {
    /// Connections open at once; beyond it the longest-waiting idle or half-sent connection
    /// makes room, else a new one is closed at once.
    #[arg(long, value_name = "N", default_value_t = ServeLimits::default().max_connections)]
    max_connections: usize,
    /// Connections one client address (IPv4 address, IPv6 /64) may hold at once.
    #[arg(long, value_name = "N", default_value_t = ServeLimits::default().max_connections_per_address)]
    max_connections_per_address: usize,
    /// New connections one client address may open per second (sustained).
    #[arg(long, value_name = "N", default_value_t = ServeLimits::default().new_connections_per_address_per_second)]
    new_connections_per_address_per_second: u32,
    /// New connections one client address may open at once before the per-second rate applies.
    #[arg(long, value_name = "N", default_value_t = ServeLimits::default().new_connection_burst_per_address)]
    new_connection_burst_per_address: u32,
    /// Connection slots only xAgent's authenticated data plane (/ws) may hold.
    #[arg(long, value_name = "N", default_value_t = ServeLimits::default().reserved_data_plane_connections)]
    reserved_data_plane_connections: usize,
    /// A reverse proxy in front of this Connector (address or network, repeatable): exempt from
    /// the per-address limits, and its Forwarded / X-Forwarded-For names the client. Default: none
    /// trusted.
    #[arg(long = "trusted-proxy", value_name = "ADDRESS[/PREFIX]", value_parser = parse_trusted_proxy)]
    trusted_proxies: Vec<IpNet>,
    /// Serve /metrics (Prometheus text format) and /readyz on this address (host:port), apart
    /// from the Connector's listener. Default: off. Nothing guards it: bind it where only the
    /// monitoring reaches (127.0.0.1 or a private network).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
}

impl ListenArgs {
    /// Starts `server`'s metrics listener when `--metrics-listen` was given, and prints
    /// `metrics listening on http://ADDR/metrics`.
    pub async fn start_metrics(
        &self,
        server: &xagent_server_runtime::ConnectorServer,
    ) -> Result<(), String> {
        let Some(addr) = &self.metrics_listen else { return Ok(()) };
        let local = server
            .start_metrics(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} for --metrics-listen: {e}"))?;
        println!("metrics listening on http://{local}/metrics");
        Ok(())
    }

    /// The limits these flags describe (the runtime's defaults for the rest).
    pub fn limits(&self) -> Result<ServeLimits, String> {
        if self.max_connections == 0 || self.max_connections_per_address == 0 {
            return Err(
                "--max-connections and --max-connections-per-address must be at least 1".into()
            );
        }
        if self.new_connections_per_address_per_second == 0
            || self.new_connection_burst_per_address == 0
        {
            return Err("--new-connections-per-address-per-second and --new-connection-burst-per-address must be at least 1".into());
        }
        if self.reserved_data_plane_connections >= self.max_connections {
            return Err("--reserved-data-plane-connections must be below --max-connections".into());
        }
        Ok(ServeLimits::default()
            .with_max_connections(self.max_connections)
            .with_per_address(
                self.max_connections_per_address,
                self.new_connections_per_address_per_second,
                self.new_connection_burst_per_address,
            )
            .with_reserved_data_plane_connections(self.reserved_data_plane_connections)
            .with_trusted_proxies(self.trusted_proxies.clone()))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        listener: ListenArgs,
    }

    fn limits(args: &[&str]) -> Result<ServeLimits, String> {
        let mut all = vec!["test"];
        all.extend_from_slice(args);
        Command::try_parse_from(all).map_err(|e| e.to_string())?.listener.limits()
    }

    #[test]
    fn the_flags_default_to_the_runtimes_limits() {
        assert_eq!(limits(&[]).unwrap(), ServeLimits::default());
    }

    #[test]
    fn the_flags_set_every_listener_limit() {
        let set = limits(&[
            "--max-connections=2000",
            "--max-connections-per-address=50",
            "--new-connections-per-address-per-second=10",
            "--new-connection-burst-per-address=20",
            "--reserved-data-plane-connections=8",
            "--trusted-proxy=10.0.0.0/8",
            "--trusted-proxy=::1",
        ])
        .unwrap();
        assert_eq!(set.max_connections, 2000);
        assert_eq!(set.max_connections_per_address, 50);
        assert_eq!(set.new_connections_per_address_per_second, 10);
        assert_eq!(set.new_connection_burst_per_address, 20);
        assert_eq!(set.reserved_data_plane_connections, 8);
        assert!(set.is_trusted_proxy("10.9.8.7".parse().unwrap()));
        assert!(set.is_trusted_proxy("::1".parse().unwrap()));
        assert!(!set.is_trusted_proxy("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn nonsense_limits_are_usage_errors() {
        assert!(limits(&["--max-connections-per-address=0"]).is_err());
        assert!(limits(&["--new-connections-per-address-per-second=0"]).is_err());
        assert!(limits(&["--max-connections=10", "--reserved-data-plane-connections=10"]).is_err());
        assert!(limits(&["--trusted-proxy=proxy.example"]).is_err());
    }
}
