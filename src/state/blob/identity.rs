//! Which storage account and credential a storage setting names, following the Azure Functions convention
//! for identity-based connections.
//!
//! A Functions app names its storage with one setting prefix (`AzureWebJobsStorage` by default). The host
//! reads it as a connection string when the setting itself is set, and otherwise from the nested settings
//! `{prefix}__blobServiceUri` / `{prefix}__serviceUri` / `{prefix}__accountName` with an Entra ID
//! credential: `{prefix}__credential=managedidentity` (plus `__clientId` or `__managedIdentityResourceId`
//! for a user-assigned identity), a client secret for local development (`__tenantId`, `__clientId`,
//! `__clientSecret`), the system-assigned identity when running in Azure, and the developer's own
//! sign-in (Azure CLI / azd) elsewhere. Resolution is a pure function of the settings so it can be tested
//! without any network; building the credential is separate.

use super::connection_string::parse_endpoint;
use crate::config::Secret;
use azure_core::credentials::TokenCredential;
use azure_core::http::{ClientOptions, Url};
use azure_identity::{
    ClientSecretCredential, ClientSecretCredentialOptions, DeveloperToolsCredential, ManagedIdentityCredential,
    ManagedIdentityCredentialOptions, UserAssignedId,
};
use std::sync::Arc;

/// What a storage setting prefix resolves to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    ConnectionString(Secret),
    Identity { blob_endpoint: Url, credential: CredentialChoice },
}

/// The Entra ID credential to use for an identity-based connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CredentialChoice {
    /// System-assigned when both are `None`; otherwise the user-assigned identity with that client id or
    /// Azure resource id.
    ManagedIdentity {
        client_id: Option<String>,
        resource_id: Option<String>,
    },
    ClientSecret {
        tenant_id: String,
        client_id: String,
        secret: Secret,
    },
    DeveloperTools,
}

impl CredentialChoice {
    /// The credential. `client_options` (transport and retry bounds) serve the client secret's token requests;
    /// the managed identity keeps the SDK's, which follow the identity endpoint's own retry guidance. The
    /// authority a client secret is sent to is Microsoft Entra ID's public cloud, or `AZURE_AUTHORITY_HOST`
    /// (https only) for a sovereign cloud.
    pub(crate) fn build(&self, client_options: ClientOptions) -> azure_core::Result<Arc<dyn TokenCredential>> {
        Ok(match self {
            Self::ManagedIdentity { client_id, resource_id } => {
                let user_assigned_id = match (client_id, resource_id) {
                    (Some(id), _) => Some(UserAssignedId::ClientId(id.clone())),
                    (None, Some(id)) => Some(UserAssignedId::ResourceId(id.clone())),
                    (None, None) => None,
                };
                ManagedIdentityCredential::new(Some(ManagedIdentityCredentialOptions {
                    user_assigned_id,
                    ..Default::default()
                }))?
            }
            Self::ClientSecret { tenant_id, client_id, secret } => ClientSecretCredential::new(
                tenant_id,
                client_id.clone(),
                azure_core::credentials::Secret::new(secret.expose().to_string()),
                Some(ClientSecretCredentialOptions { client_options }),
            )?,
            Self::DeveloperTools => DeveloperToolsCredential::new(None)?,
        })
    }

    /// What to check when this credential cannot get a token: the settings of `prefix` that make it up.
    pub(crate) fn token_hint(&self, prefix: &str) -> String {
        match self {
            Self::ManagedIdentity { client_id: None, resource_id: None } => format!(
                "check that the app has a system-assigned managed identity, or name a user-assigned one with \
                 {prefix}__clientId"
            ),
            Self::ManagedIdentity { .. } => format!(
                "check that {prefix}__clientId or {prefix}__managedIdentityResourceId names a managed identity \
                 assigned to the app"
            ),
            Self::ClientSecret { .. } => format!(
                "check {prefix}__tenantId, {prefix}__clientId and {prefix}__clientSecret (the secret's value, not \
                 its id; secrets expire) and, in a sovereign cloud, set AZURE_AUTHORITY_HOST to its Entra ID \
                 authority"
            ),
            Self::DeveloperTools => format!(
                "sign in with `az login` or `azd auth login`, or set {prefix}__credential=managedidentity when \
                 running in Azure"
            ),
        }
    }

    /// What to check when storage refuses a token from this credential.
    pub(crate) fn hint(&self) -> &'static str {
        match self {
            Self::ManagedIdentity { .. } => {
                "grant the app's managed identity the 'Storage Blob Data Contributor' role on the storage account \
                 (new role assignments can take a few minutes to apply)"
            }
            Self::ClientSecret { .. } => {
                "grant the service principal the 'Storage Blob Data Contributor' role on the storage account"
            }
            Self::DeveloperTools => {
                "sign in with `az login` and grant your account the 'Storage Blob Data Contributor' role on the \
                 storage account"
            }
        }
    }
}

/// Resolves `prefix` (e.g. `AzureWebJobsStorage`) against the settings. Errors are operator messages.
pub(crate) fn resolve(get: &dyn Fn(&str) -> Option<String>, prefix: &str) -> Result<Resolved, String> {
    let setting = |name: &str| {
        let key = if name.is_empty() { prefix.to_string() } else { format!("{prefix}__{name}") };
        get(&key).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).map(|v| (key, v))
    };

    if let Some((_, cs)) = setting("") {
        return Ok(Resolved::ConnectionString(Secret::new(cs)));
    }

    let blob_endpoint = if let Some((key, uri)) = setting("blobServiceUri").or_else(|| setting("serviceUri")) {
        let url = parse_endpoint(&uri, "").map_err(|_| format!("{key} is not an http or https URL"))?;
        if url.scheme() != "https" {
            return Err(format!("{key} must be an https URL: storage accepts Entra ID tokens over https only"));
        }
        url
    } else if let Some((key, account)) = setting("accountName") {
        let valid =
            (3..=24).contains(&account.len()) && account.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !valid {
            return Err(format!("{key} is not a storage account name (3-24 lowercase letters and digits)"));
        }
        parse_endpoint(&format!("https://{account}.blob.core.windows.net"), "")
            .map_err(|_| format!("{key} does not form a valid endpoint"))?
    } else {
        return Err(format!(
            "{prefix} is not set: set it to a storage connection string (UseDevelopmentStorage=true with Azurite \
             locally) or set {prefix}__accountName for managed identity"
        ));
    };

    let client_id = setting("clientId").map(|(_, v)| v);
    let managed = setting("credential").is_some_and(|(_, v)| v.eq_ignore_ascii_case("managedidentity"));
    let credential = if managed {
        let resource_id = setting("managedIdentityResourceId").map(|(_, v)| v);
        CredentialChoice::ManagedIdentity { client_id, resource_id }
    } else if let (Some((_, tenant_id)), Some(client_id), Some((_, secret))) =
        (setting("tenantId"), client_id, setting("clientSecret"))
    {
        CredentialChoice::ClientSecret { tenant_id, client_id, secret: Secret::new(secret) }
    } else if get("IDENTITY_ENDPOINT").is_some() || get("MSI_ENDPOINT").is_some() {
        // Hosted in Azure (App Service / Functions set these): the system-assigned identity, as the host does.
        CredentialChoice::ManagedIdentity { client_id: None, resource_id: None }
    } else {
        CredentialChoice::DeveloperTools
    };
    Ok(Resolved::Identity { blob_endpoint, credential })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve_with(settings: &[(&str, &str)]) -> Result<Resolved, String> {
        let map: HashMap<String, String> = settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        resolve(&|k| map.get(k).cloned(), "AzureWebJobsStorage")
    }

    fn endpoint(s: &str) -> Url {
        Url::parse(s).expect("valid url")
    }

    #[test]
    fn the_setting_itself_is_a_connection_string() {
        let got = resolve_with(&[("AzureWebJobsStorage", "UseDevelopmentStorage=true")]);
        assert_eq!(got, Ok(Resolved::ConnectionString(Secret::new("UseDevelopmentStorage=true"))));
    }

    #[test]
    fn an_account_name_with_managed_identity_and_client_id_is_user_assigned() {
        let got = resolve_with(&[
            ("AzureWebJobsStorage__accountName", "myacct"),
            ("AzureWebJobsStorage__credential", "managedidentity"),
            ("AzureWebJobsStorage__clientId", "00000000-0000-0000-0000-000000000001"),
        ]);
        assert_eq!(
            got,
            Ok(Resolved::Identity {
                blob_endpoint: endpoint("https://myacct.blob.core.windows.net"),
                credential: CredentialChoice::ManagedIdentity {
                    client_id: Some("00000000-0000-0000-0000-000000000001".into()),
                    resource_id: None,
                },
            })
        );
    }

    #[test]
    fn a_blob_service_uri_wins_over_the_account_name() {
        let got = resolve_with(&[
            ("AzureWebJobsStorage__blobServiceUri", "https://acct.blob.core.usgovcloudapi.net/"),
            ("AzureWebJobsStorage__accountName", "other"),
            ("AzureWebJobsStorage__credential", "ManagedIdentity"),
        ]);
        assert_eq!(
            got,
            Ok(Resolved::Identity {
                blob_endpoint: endpoint("https://acct.blob.core.usgovcloudapi.net"),
                credential: CredentialChoice::ManagedIdentity { client_id: None, resource_id: None },
            })
        );
    }

    #[test]
    fn without_a_credential_setting_azure_hosting_means_managed_identity_and_elsewhere_developer_tools() {
        let in_azure = resolve_with(&[
            ("AzureWebJobsStorage__accountName", "myacct"),
            ("IDENTITY_ENDPOINT", "http://localhost:42356/msi/token"),
        ]);
        assert!(matches!(
            in_azure,
            Ok(Resolved::Identity { credential: CredentialChoice::ManagedIdentity { client_id: None, .. }, .. })
        ));
        let local = resolve_with(&[("AzureWebJobsStorage__accountName", "myacct")]);
        assert!(matches!(local, Ok(Resolved::Identity { credential: CredentialChoice::DeveloperTools, .. })));
    }

    #[test]
    fn a_client_secret_triple_selects_the_service_principal() {
        let got = resolve_with(&[
            ("AzureWebJobsStorage__accountName", "myacct"),
            ("AzureWebJobsStorage__tenantId", "tenant"),
            ("AzureWebJobsStorage__clientId", "client"),
            ("AzureWebJobsStorage__clientSecret", "s3cret"),
        ]);
        let Ok(Resolved::Identity { credential, .. }) = got else { panic!("expected identity, got {got:?}") };
        assert_eq!(
            credential,
            CredentialChoice::ClientSecret {
                tenant_id: "tenant".into(),
                client_id: "client".into(),
                secret: Secret::new("s3cret")
            }
        );
        assert!(!format!("{credential:?}").contains("s3cret"));
    }

    #[test]
    fn nothing_configured_says_what_to_set() {
        assert_eq!(
            resolve_with(&[]),
            Err("AzureWebJobsStorage is not set: set it to a storage connection string (UseDevelopmentStorage=true \
                 with Azurite locally) or set AzureWebJobsStorage__accountName for managed identity"
                .into())
        );
        let other = resolve(&|_| None, "StateStorage").expect_err("nothing set");
        assert!(other.starts_with("StateStorage is not set") && other.contains("StateStorage__accountName"));
    }

    #[test]
    fn bad_identity_settings_are_named() {
        let err = resolve_with(&[("AzureWebJobsStorage__accountName", "My_Account")]).expect_err("invalid");
        assert!(err.starts_with("AzureWebJobsStorage__accountName is not a storage account name"), "{err}");
        let err = resolve_with(&[("AzureWebJobsStorage__blobServiceUri", "http://127.0.0.1:10000/devstoreaccount1")])
            .expect_err("http");
        assert!(err.starts_with("AzureWebJobsStorage__blobServiceUri must be an https URL"), "{err}");
    }
}
