//! The ADO.NET connection string as Azure shows it: which keys tiberius reads itself, and the ones read here
//! (`Authentication`, the timeouts, `ConnectRetryCount`), with messages that name the app setting and never a
//! value of the string.

use super::DEFAULT_RECONNECTS;
use crate::config::Secret;
use std::time::Duration;
use tiberius::Config;

/// How the login authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// User ID and Password in the connection string.
    SqlPassword,
    /// `Authentication=Active Directory Managed Identity` (or `... MSI`): the system-assigned identity, or
    /// the user-assigned one whose client id is in `User ID`, as Microsoft.Data.SqlClient reads it.
    ManagedIdentity { client_id: Option<String> },
    /// `Authentication=Active Directory Default`: the managed identity when hosted in Azure, else the
    /// developer's Azure CLI / azd sign-in. `User ID`, when given, is the user-assigned identity's client id, as
    /// Microsoft.Data.SqlClient reads it (`ActiveDirectoryAuthenticationProvider` sets it as the
    /// `ManagedIdentityClientId` of its `DefaultAzureCredential`).
    Default { client_id: Option<String> },
}

/// A parsed connection string. Holds the password inside tiberius' `Config`, which redacts it in `Debug`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config: Config,
    pub auth: Auth,
    pub connect_timeout: Duration,
    /// The Entra ID scope a token is asked for: the database resource of the cloud the server is in.
    pub token_scope: String,
    /// `ConnectRetryCount`, as ADO.NET means it: how many fresh connections may replace a pooled one found
    /// dead when reused (0 to 255, default 1; 0 turns it off). Never a retry of a failed statement.
    pub reconnects: u32,
    /// The app setting's name, for messages (never its value).
    pub setting: String,
    /// The connection string's digest: the sources and sinks of one string share one pool (`db::pools`).
    pub database: crate::db::pools::DatabaseKey,
}

/// `key=value` pairs of an ADO.NET connection string: keys lower-cased without spaces, values unquoted.
/// Only used to read the keys tiberius does not know (`Authentication`, timeouts) and to scrub values from
/// error messages; tiberius parses the string itself.
pub(crate) fn pairs(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ';' || c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if key.trim().is_empty() {
            return out;
        }
        while chars.peek().is_some_and(|c| *c == ' ') {
            chars.next();
        }
        let mut value = String::new();
        match chars.peek().copied() {
            Some(q @ ('\'' | '"')) => {
                chars.next();
                while let Some(c) = chars.next() {
                    if c == q {
                        if chars.peek() == Some(&q) {
                            chars.next();
                            value.push(q);
                            continue;
                        }
                        break;
                    }
                    value.push(c);
                }
                for c in chars.by_ref() {
                    if c == ';' {
                        break;
                    }
                }
            }
            Some('{') => {
                chars.next();
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                    value.push(c);
                }
                for c in chars.by_ref() {
                    if c == ';' {
                        break;
                    }
                }
            }
            _ => {
                for c in chars.by_ref() {
                    if c == ';' {
                        break;
                    }
                    value.push(c);
                }
            }
        }
        let key: String = key.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase();
        out.push((key, value.trim().to_string()));
    }
}

/// Replaces every value of the connection string that appears in `text` with `***`, so a driver message
/// that quotes a fragment never carries a password into a log.
fn scrub(text: &str, pairs: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (_, v) in pairs {
        if v.len() >= 3 {
            out = out.replace(v.as_str(), "***");
        }
    }
    out
}

impl Settings {
    /// Reads the connection string in app setting `setting`; a refusal names the setting and what to change,
    /// never a value of the string.
    pub fn parse(setting: &str, connection: &Secret) -> Result<Self, String> {
        let text = connection.expose();
        let kv = pairs(text);
        let get = |keys: &[&str]| kv.iter().find(|(k, _)| keys.contains(&k.as_str())).map(|(_, v)| v.clone());
        let bad = |why: String| {
            format!(
                "app setting {setting} is not a usable SQL Server connection string ({}); use the ADO.NET form Azure shows, e.g. Server=tcp:myserver.database.windows.net,1433;Database=mydb;User ID=...;Password=...;Encrypt=True",
                scrub(&why, &kv)
            )
        };
        if text.trim_start().starts_with("postgres") {
            return Err(bad("it looks like a PostgreSQL URL; use source postgres-cursor for PostgreSQL".into()));
        }
        let mut config = Config::from_ado_string(text).map_err(|e| bad(e.to_string()))?;
        if get(&["server", "datasource", "address", "addr", "networkaddress"]).is_none() {
            return Err(bad("it has no Server".into()));
        }
        let client_id = || get(&["userid", "uid", "user", "username"]).filter(|v| !v.is_empty());
        let auth = match get(&["authentication"]).map(|a| a.to_ascii_lowercase().replace([' ', '-'], "")) {
            None => Auth::SqlPassword,
            Some(a) if a == "sqlpassword" => Auth::SqlPassword,
            Some(a) if a == "activedirectorymanagedidentity" || a == "activedirectorymsi" => {
                Auth::ManagedIdentity { client_id: client_id() }
            }
            Some(a) if a == "activedirectorydefault" => Auth::Default { client_id: client_id() },
            Some(other) => {
                return Err(bad(format!(
                    "Authentication={other} is not supported; use Active Directory Managed Identity, Active Directory Default, or SQL authentication (User ID and Password)"
                )))
            }
        };
        let seconds = |keys: &[&str], default: u64| -> Result<Duration, String> {
            match get(keys) {
                None => Ok(Duration::from_secs(default)),
                Some(v) => match v.parse::<u64>() {
                    Ok(0) => Ok(Duration::from_secs(default)),
                    Ok(n) if n <= 3600 => Ok(Duration::from_secs(n)),
                    _ => Err(bad(format!("{} must be seconds from 0 to 3600", keys[0]))),
                },
            }
        };
        let connect_timeout = seconds(&["connecttimeout", "connectiontimeout", "timeout"], 15)?;
        let command_timeout = seconds(&["commandtimeout"], 30)?;
        let reconnects = match get(&["connectretrycount"]) {
            None => DEFAULT_RECONNECTS,
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| *n <= 255)
                .ok_or_else(|| bad("ConnectRetryCount must be 0 to 255".into()))?,
        };
        config.handshake_timeout(Some(connect_timeout));
        config.command_timeout(Some(command_timeout));
        if get(&["applicationname"]).is_none() {
            config.application_name("sql-pseudo-trigger");
        }
        let token_scope = token_scope(&config.get_addr());
        let database = crate::db::pools::DatabaseKey::of("mssql", &[text.as_bytes()]);
        Ok(Self { config, auth, connect_timeout, token_scope, reconnects, setting: setting.to_string(), database })
    }
}

/// The Entra ID scope for a server: its cloud's database resource. SqlClient asks for the resource the server
/// names during the login (FEDAUTHINFO); tiberius sends a token it is given up front, so the cloud is read
/// from the server's DNS suffix instead (Azure SQL Database, Managed Instance and Synapse in each cloud). Any
/// other name (a custom DNS alias, a local server) gets the public cloud's resource.
pub fn token_scope(addr: &str) -> String {
    const CLOUDS: &[(&str, &str)] = &[
        (".database.usgovcloudapi.net", "https://database.usgovcloudapi.net/.default"),
        (".database.chinacloudapi.cn", "https://database.chinacloudapi.cn/.default"),
        (".sql.azuresynapse.usgovcloudapi.net", "https://database.usgovcloudapi.net/.default"),
        (".sql.azuresynapse.azure.cn", "https://database.chinacloudapi.cn/.default"),
    ];
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host).trim_end_matches('.').to_ascii_lowercase();
    CLOUDS.iter().find(|(suffix, _)| host.ends_with(suffix)).map_or(super::TOKEN_SCOPE, |(_, scope)| scope).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(cs: &str) -> Result<Settings, String> {
        Settings::parse("SqlConnectionString", &Secret::new(cs))
    }

    #[test]
    fn reads_the_connection_string_azure_shows() {
        let s = parse("Server=tcp:myserver.database.windows.net,1433;Initial Catalog=mydb;Persist Security Info=False;User ID=app;Password=p@ss=w0rd=;MultipleActiveResultSets=False;Encrypt=True;TrustServerCertificate=False;Connection Timeout=30;")
            .expect("parses");
        assert_eq!(s.auth, Auth::SqlPassword);
        assert_eq!(s.connect_timeout, Duration::from_secs(30));
        assert_eq!(s.config.get_addr(), "myserver.database.windows.net:1433");
    }

    #[test]
    fn managed_identity_takes_the_client_id_from_user_id() {
        let s = parse("Server=tcp:x.database.windows.net,1433;Database=db;Authentication=Active Directory Managed Identity;User Id=1111-2222")
            .expect("parses");
        assert_eq!(s.auth, Auth::ManagedIdentity { client_id: Some("1111-2222".into()) });
        let s = parse("Server=tcp:x,1433;Authentication=\"Active Directory Default\"").expect("parses");
        assert_eq!(s.auth, Auth::Default { client_id: None });
        let e = parse("Server=tcp:x,1433;Authentication=Active Directory Password;User ID=u;Password=hunter22")
            .unwrap_err();
        assert!(e.contains("activedirectorypassword is not supported") && !e.contains("hunter22"), "{e}");
    }

    #[test]
    fn active_directory_default_takes_the_user_assigned_identity_from_user_id_as_sqlclient_does() {
        let s =
            parse("Server=tcp:x.database.windows.net,1433;Authentication=Active Directory Default;User ID=3333-4444")
                .expect("parses");
        assert_eq!(s.auth, Auth::Default { client_id: Some("3333-4444".into()) });
    }

    #[test]
    fn the_token_scope_is_the_database_resource_of_the_servers_cloud() {
        let scope = |server: &str| parse(&format!("Server=tcp:{server},1433")).expect("parses").token_scope;
        assert_eq!(scope("x.database.windows.net"), "https://database.windows.net/.default");
        assert_eq!(scope("mi.abc123.database.windows.net"), "https://database.windows.net/.default");
        assert_eq!(scope("x.database.usgovcloudapi.net"), "https://database.usgovcloudapi.net/.default");
        assert_eq!(scope("X.Database.ChinaCloudApi.cn"), "https://database.chinacloudapi.cn/.default");
        assert_eq!(
            scope("ws-ondemand.sql.azuresynapse.usgovcloudapi.net"),
            "https://database.usgovcloudapi.net/.default"
        );
        assert_eq!(scope("localhost"), "https://database.windows.net/.default");
    }

    #[test]
    fn bad_strings_name_the_setting_and_never_the_password() {
        let e = parse("Server=tcp:x,1433;Password=s3cr3t-value;Connection Timeout=soon").unwrap_err();
        assert!(e.starts_with("app setting SqlConnectionString is not a usable SQL Server connection string"), "{e}");
        assert!(!e.contains("s3cr3t-value"), "{e}");
        let e = parse("postgres://u:pw@h/db").unwrap_err();
        assert!(e.contains("PostgreSQL"), "{e}");
        assert!(parse("Database=db;User ID=u").unwrap_err().contains("no Server"));
    }

    #[test]
    fn connect_retry_count_is_the_number_of_reconnections_ado_net_allows() {
        assert_eq!(parse("Server=tcp:x,1433").expect("parses").reconnects, 1, "ADO.NET's default");
        assert_eq!(parse("Server=tcp:x,1433;ConnectRetryCount=0").expect("parses").reconnects, 0);
        assert_eq!(parse("Server=tcp:x,1433;Connect Retry Count=255").expect("parses").reconnects, 255);
        let e = parse("Server=tcp:x,1433;ConnectRetryCount=256").unwrap_err();
        assert!(e.ends_with("(ConnectRetryCount must be 0 to 255); use the ADO.NET form Azure shows, e.g. Server=tcp:myserver.database.windows.net,1433;Database=mydb;User ID=...;Password=...;Encrypt=True"), "{e}");
    }

    #[test]
    fn quoted_values_keep_their_semicolons() {
        let kv = pairs("Server=a;Password='x;y''z';Authentication={Active Directory Default};");
        assert_eq!(kv[1], ("password".into(), "x;y'z".into()));
        assert_eq!(kv[2], ("authentication".into(), "Active Directory Default".into()));
    }
}
