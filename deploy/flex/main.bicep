// A Flex Consumption function app for sql-pseudo-trigger, deployed into an existing resource group:
// - a user-assigned managed identity that the app uses for everything: its storage (AzureWebJobsStorage,
//   identity-based, no account keys), the deployment package container, Application Insights, and Azure SQL
//   when sqlServerName is given;
// - the storage account, its deployment container and the queue the trigger writes to;
// - one trigger's app settings (the schedule its function.json names, the connection string its
//   sqltrigger.json names).
//
// Flex Consumption takes the runtime from functionAppConfig.runtime (name 'custom' for a custom handler)
// and rejects the FUNCTIONS_WORKER_RUNTIME app setting (and FUNCTIONS_EXTENSION_VERSION,
// WEBSITE_RUN_FROM_PACKAGE, WEBSITE_CONTENT*): none is set here. deploy/tests checks that offline.
//
//   az deployment group create -g <rg> -f deploy/flex/main.bicep -p postgresConnectionString='...'
//   deploy/flex/deploy.sh does this, then packages and deploys the zip (docs/deploy.md).

@description('Region of every resource; Flex Consumption is offered in a subset of regions (az functionapp list-flexconsumption-locations).')
param location string = resourceGroup().location

@description('Name of the function app (globally unique: it becomes <name>.azurewebsites.net).')
param appName string = 'sqltrigger-${uniqueString(resourceGroup().id)}'

@description('The trigger function this app runs: a folder of the zip (scripts/package NAME).')
param functionName string = 'PgOrdersChanged'

@description('Its timer schedule (NCRONTAB with seconds); set as the app setting <functionName>_Schedule that function.json names. Every second, as the templates: 100 changes/s at batch 100 (docs/operations.md, "What a one-second schedule costs on each plan").')
param schedule string = '* * * * * *'

@description('The queue the function writes its changes to (queueName in function.json).')
param queueName string = 'orders-changes'

@description('The app setting the function\'s sqltrigger.json names in connectionStringSetting.')
param connectionStringSetting string = 'PostgresConnectionString'

@secure()
@description('The connection string for that setting (PostgreSQL: postgres://user:password@host:5432/db?sslmode=require). Leave empty when sqlServerName is given.')
param connectionString string = ''

@description('Azure SQL logical server name (without .database.windows.net): the connection string is then built to sign in as the managed identity, no password.')
param sqlServerName string = ''

@description('Azure SQL database name, with sqlServerName.')
param sqlDatabaseName string = ''

@allowed([512, 2048, 4096])
@description('Memory of each instance; the handler needs far less than 512 MB. Flex bills this memory for at least 1,000 ms per execution, so a function firing every second is billed around the clock: 512 costs a quarter of the plan\'s own default, 2048.')
param instanceMemoryMB int = 512

@minValue(40)
@maxValue(1000)
@description('Most instances the app may scale to. A timer function runs on one instance at a time; the admin function is HTTP.')
param maximumInstanceCount int = 40

var suffix = uniqueString(resourceGroup().id, appName)
var storageName = take('sqltrig${suffix}', 24)
var deploymentContainer = 'deployment-package'
var roles = {
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
}
var useAzureSql = !empty(sqlServerName)
var sqlConnectionString = 'Server=tcp:${sqlServerName}${environment().suffixes.sqlServerHostname},1433;Database=${sqlDatabaseName};Authentication=Active Directory Managed Identity;User Id=${identity.properties.clientId};Encrypt=True'

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${appName}-identity'
  location: location
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageName
  location: location
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    allowBlobPublicAccess: false
    // Everything signs in with the managed identity, the handler's state store included.
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource packageContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainer
  properties: {
    publicAccess: 'None'
  }
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource changesQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: queueName
}

resource logs 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: '${appName}-logs'
  location: location
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: 30
  }
}

resource insights 'Microsoft.Insights/components@2020-02-02' = {
  name: '${appName}-insights'
  location: location
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logs.id
    DisableLocalAuth: true
  }
}

// Blob Data Owner: the host's own blobs (timer locks, keys), the deployment package, and the handler's state
// documents (one blob per function, written with compare-and-swap).
resource blobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, identity.id, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// Queue Data Contributor: the function's queue output binding writes each change to orders-changes.
resource queueContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, identity.id, roles.storageQueueDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(insights.id, identity.id, roles.monitoringMetricsPublisher)
  scope: insights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: '${appName}-plan'
  location: location
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true
  }
}

var baseSettings = [
  // Identity-based AzureWebJobsStorage: the host and the handler's blob state store both read these three.
  {
    name: 'AzureWebJobsStorage__accountName'
    value: storage.name
  }
  {
    name: 'AzureWebJobsStorage__credential'
    value: 'managedidentity'
  }
  {
    name: 'AzureWebJobsStorage__clientId'
    value: identity.properties.clientId
  }
  {
    name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
    value: insights.properties.ConnectionString
  }
  {
    name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
    value: 'ClientId=${identity.properties.clientId};Authorization=AAD'
  }
  {
    name: '${functionName}_Schedule'
    value: schedule
  }
  // State documents are named after the app; set explicitly so a rename or a new app keeps the state.
  {
    name: 'Sql_Trigger_AppName'
    value: appName
  }
]
var connectionSettings = useAzureSql ? [
  {
    name: connectionStringSetting
    value: sqlConnectionString
  }
] : [
  {
    name: connectionStringSetting
    value: connectionString
  }
]

resource app 'Microsoft.Web/sites@2024-04-01' = {
  name: appName
  location: location
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    siteConfig: {
      minTlsVersion: '1.2'
      appSettings: concat(baseSettings, connectionSettings)
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainer}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identity.id
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'custom'
        version: '1.0'
      }
    }
  }
  dependsOn: [
    packageContainer
    changesQueue
    blobOwner
    queueContributor
  ]
}

output functionAppName string = app.name
output identityClientId string = identity.properties.clientId
output identityPrincipalId string = identity.properties.principalId
output storageAccountName string = storage.name
output queueName string = changesQueue.name
