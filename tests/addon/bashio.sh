# shellcheck shell=bash
# The few bashio functions the add-on's scripts use, reading $OPTIONS (an options.json) as
# Supervisor's bashio reads /data/options.json. For tests only.
bashio::config() {
    local value
    value=$(jq -r --arg key "$1" 'if has($key) and .[$key] != null then .[$key] else "null" end' "$OPTIONS")
    if [[ "$value" == "null" && $# -gt 1 ]]; then value="$2"; fi
    printf '%s' "$value"
}
bashio::config.true() { [[ "$(bashio::config "$1")" == "true" ]]; }
bashio::config.has_value() { local v; v=$(bashio::config "$1"); [[ -n "$v" && "$v" != "null" ]]; }
bashio::log.info() { echo "INFO: $*" >&2; }
bashio::log.error() { echo "ERROR: $*" >&2; }
