#!/usr/bin/env bash
# Creates (or updates) a Flex Consumption app from deploy/flex/main.bicep, then packages the handler and
# deploys the zip to it. Needs the Azure CLI (`az login` first) and what scripts/package needs.
#
#   deploy/flex/deploy.sh <resource-group> <location> [name=value ...]     # extra template parameters
#   deploy/flex/deploy.sh orders-rg swedencentral connectionString='postgres://app:...@db.example.com/shop?sslmode=require'
#   FUNCTIONS="PgOrdersChanged SqlTriggerAdmin" deploy/flex/deploy.sh ...   # the function folders to ship
#
# Ship only the functions the app has settings for: at start the handler checks every function folder's
# settings and refuses to start (naming the missing setting) if one is unset.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

say() { printf 'deploy/flex/deploy.sh: %s\n' "$*" >&2; }

[[ $# -ge 2 ]] || { say "usage: deploy/flex/deploy.sh <resource-group> <location> [name=value ...]"; exit 2; }
command -v az >/dev/null || { say "the Azure CLI (az) is missing: https://aka.ms/azure-cli, then az login"; exit 1; }
rg=$1
location=$2
shift 2
read -r -a functions <<<"${FUNCTIONS:-PgOrdersChanged SqlTriggerAdmin}"

say "resource group $rg in $location"
az group create --name "$rg" --location "$location" --output none
say "deploying deploy/flex/main.bicep"
app=$(az deployment group create --resource-group "$rg" --template-file deploy/flex/main.bicep \
  --parameters location="$location" "$@" --query properties.outputs.functionAppName.value --output tsv)

scripts/package "${functions[@]}"
say "deploying dist/functionapp.zip to $app"
az functionapp deployment source config-zip --resource-group "$rg" --name "$app" --src dist/functionapp.zip
say "done. Role assignments can take a few minutes to apply: until then the handler logs 403s from storage and"
say "retries. Check: az functionapp function list -g $rg -n $app; handler state status through the admin function."
