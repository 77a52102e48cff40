// Drives a Toxiproxy API (real Toxiproxy, or chaosproxy's) with Toxiproxy's own Go client, and observes each
// step's effect with a real HTTP client (net/http) through the proxy. Prints one JSON object.
//   drive API_ADDR UPSTREAM_HOST:PORT        (tests/test_toxiproxy_api.py builds and runs it)
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
)

var web = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func get(listen string) map[string]interface{} {
	start := time.Now()
	response, err := web.Get("http://" + listen + "/health")
	if err == nil {
		_, err = io.Copy(io.Discard, response.Body)
		response.Body.Close()
	}
	ms := time.Since(start).Milliseconds()
	if err != nil {
		return map[string]interface{}{"error": err.Error(), "ms": ms}
	}
	return map[string]interface{}{"status": response.StatusCode, "ms": ms}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	api, upstream := os.Args[1], os.Args[2]
	client := toxiproxy.NewClient(api)
	seen := map[string]interface{}{}
	must(client.ResetState())
	populated, err := client.Populate([]toxiproxy.Proxy{{Name: "populated", Listen: "127.0.0.1:0", Upstream: upstream, Enabled: true}})
	must(err)
	seen["populated"] = get(populated[0].Listen)
	proxy, err := client.CreateProxy("web", "127.0.0.1:0", upstream)
	must(err)
	seen["plain"] = get(proxy.Listen)

	slow, err := proxy.AddToxic("slow", "latency", "downstream", 1, toxiproxy.Attributes{"latency": 600, "jitter": 0})
	must(err)
	seen["latency_toxic"] = slow
	seen["latency"] = get(proxy.Listen)
	must(proxy.RemoveToxic("slow"))
	seen["after_latency"] = get(proxy.Listen)

	cut, err := proxy.AddToxic("cut", "timeout", "", 1, toxiproxy.Attributes{"timeout": 300})
	must(err)
	seen["timeout_toxic"] = cut
	seen["timeout"] = get(proxy.Listen)
	must(proxy.RemoveToxic("cut"))
	seen["after_timeout"] = get(proxy.Listen)

	must(proxy.Disable())
	seen["disabled_enabled"] = proxy.Enabled
	seen["disabled"] = get(proxy.Listen)
	must(proxy.Enable())
	seen["enabled"] = get(proxy.Listen)

	_, err = proxy.AddToxic("", "latency", "", 1, toxiproxy.Attributes{"latency": 600})
	must(err)
	must(proxy.Disable())
	must(client.ResetState())
	after, err := client.Proxy("web")
	must(err)
	toxics, err := after.Toxics()
	must(err)
	seen["reset_enabled"] = after.Enabled
	seen["reset_toxics"] = len(toxics)
	seen["after_reset"] = get(after.Listen)
	all, err := client.Proxies()
	must(err)
	names := []string{}
	for name, each := range all {
		names = append(names, name)
		must(each.Delete())
	}
	sort.Strings(names)
	seen["proxies"] = names
	out, err := json.Marshal(seen)
	must(err)
	fmt.Println(string(out))
}
