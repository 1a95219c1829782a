package egress

import (
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestExfilSuspectOrdinary: names package managers, clouds and APIs really
// use must pass the DNS-exfiltration heuristics (ATTACKS #8).
func TestExfilSuspectOrdinary(t *testing.T) {
	for _, n := range []string{
		"files.pythonhosted.org",
		"pypi.org",
		"registry.npmjs.org",
		"api.github.com",
		"objects.githubusercontent.com",
		"objects-origin.githubusercontent.com",
		"release-assets.githubusercontent.com",
		"avatars-githubusercontent.example.com",
		"raw.githubusercontent.com",
		"codeload.github.com",
		"s3.us-east-1.amazonaws.com",
		"s3.dualstack.us-east-1.amazonaws.com",
		"bedrock-runtime.us-east-1.amazonaws.com",
		"123456789012.dkr.ecr.us-east-1.amazonaws.com",
		"d3e4f5g6h7.cloudfront.net",
		"d1a2b3c4d5e6f7.cloudfront.net",
		"us-central1-docker.pkg.dev",
		"europe-west4-aiplatform.googleapis.com",
		"northamerica-northeast1-aiplatform.googleapis.com",
		"generativelanguage.googleapis.com",
		"oaidalleapiprodscus.blob.core.windows.net",
		"login.microsoftonline.com",
		"packages-microsoft-prod.example.com",
		"production.cloudflare.docker.com",
		"registry-1.docker.io",
		"cdn-lfs-us-1.huggingface.co",
		"cas-bridge.xethub.hf.co",
		"firebaseinstallations.googleapis.com",
		"optimizationguide-pa.googleapis.com",
		"downloads.sourceforge.net",
		"plugins.gradle.org",
		"proxy.golang.org",
		"sum.golang.org",
		"dl-cdn.alpinelinux.org",
		"deb.debian.org",
		"security.ubuntu.com",
		"api.anthropic.com",
		"API.GitHub.com.",
		"index.crates.io",
		"static.crates.io",
		"repo.maven.apache.org",
		"production-us-east-1.example.com",
		"a.b.c.d.e.f.g.h", // exactly 8 labels
		"s3-website-us-west-2.amazonaws.com",
		"lh3.googleusercontent.com",
		"storage.googleapis.com",
		"MyCompanyServices.example.com",
		"xn--bcher-kva.example",
		"connectivitycheck.gstatic.com",
		"safebrowsing.googleapis.com",
		"accounts.google.com",
		"content-autofill.googleapis.com",
		"cloudflare-dns.com",
		"mozilla.cloudflare-dns.com",
		"pkg-containers.githubusercontent.com",
		"copilot-proxy.githubusercontent.com",
		"management.azure.com",
		"westeurope-1.in.applicationinsights.azure.com",
	} {
		if bad, why := ExfilSuspect(n); bad {
			t.Errorf("ExfilSuspect(%q) = true (%s), want false", n, why)
		}
	}
}

// exfilNames builds names the way DNS-exfiltration tools do: encoded data
// split into labels under an attacker's zone.
func exfilNames() []string {
	passwd := "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
	key := "-----BEGIN OPENSSH PRIVATE KEY-----b3BlbnNzaC1rZXktdjEAAAAABG5vbmU"
	awsKey := "AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	b32 := strings.ToLower(strings.TrimRight(base32.StdEncoding.EncodeToString([]byte(passwd)), "="))
	hx := hex.EncodeToString([]byte(awsKey))
	b64 := strings.TrimRight(base64.RawURLEncoding.EncodeToString([]byte(key)), "=")
	var out []string
	for _, size := range []int{16, 20, 24, 32, 40, 63} {
		for _, data := range []string{b32, hx, b64} {
			for i := 0; i+size <= len(data) && i < 3*size; i += size {
				out = append(out, data[i:i+size]+".attacker.test")
			}
		}
	}
	return out
}

// TestExfilSuspectExfil: encoded, long and deep names used for DNS
// exfiltration and tunnels are flagged (ATTACKS #8).
func TestExfilSuspectExfil(t *testing.T) {
	names := []string{
		"aGVsbG8gd29ybGQgdGhpcyBpcyBzZWNyZXQ.attacker.test",
		"ojxgo3tfeb2gs3tfeb2gq2lt.attacker.test",             // base32, 24
		"mnxw2ylufvsxi3dbn5xxaylmmfwgk.attacker.test",        // base32
		"4b45593d736b2d6c6976652d61626364.attacker.test",     // hex key
		"9f86d081884c7d65.attacker.test",                     // 16 hex
		"0123456789abcdef0123456789abcdef.x.attacker.test",   // hex
		"dGhpcyBpcyBzZWNy.attacker.test",                     // base64, 16
		"a.b.c.d.e.f.g.h.i",                                  // 9 labels
		strings.Repeat("a", 41) + ".attacker.test",           // long label
		strings.Repeat("abcdefghij.", 19) + "attacker.test",  // > 200
		"z2fs0bgzk4mttlbqivl9yz5ha1.lambda-url.example.test", // random id
		"kRz7Qm2pXv9LtB4n.attacker.test",                     // mixed case
		"1a2b00000000deadbeefcafe0000.dnscat.attacker.test",  // dnscat2-like
		"nbswy3dpeb3w64tmmqqhi2djomqgs4zaon.attacker.test",   // base32 text
		"mz-xw6-ytb-oi2-dbn5-xxay-lmm.attacker.test",         // hyphen-split base32
		"cGFzc3dvcmQ9aHVudGVyMg.attacker.test",               // base64 "password=hunter2"
		"ZXhwb3J0IEFXU19TRUNSRVQ.attacker.test",              // base64
		"ms8x2q7vk4rz9wpj.attacker.test",                     // random
	}
	names = append(names, exfilNames()...)
	for _, n := range names {
		if bad, _ := ExfilSuspect(n); !bad {
			t.Errorf("ExfilSuspect(%q) = false, want true", n)
		}
	}
}

// TestExfilSuspectReason: a refusal says why, without echoing the whole
// smuggled label.
func TestExfilSuspectReason(t *testing.T) {
	bad, why := ExfilSuspect("4b45593d736b2d6c6976652d61626364.attacker.test")
	if !bad || !strings.Contains(why, "hex") || strings.Contains(why, "4b45593d736b2d6c6976652d61626364") {
		t.Fatalf("got %v %q", bad, why)
	}
}

func TestRateLimiter(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		key  string
		at   time.Duration
		want bool
	}
	tests := []struct {
		name  string
		rate  float64
		burst int
		steps []step
	}{
		{"burst then refuse", 1, 3, []step{
			{"a", 0, true}, {"a", 0, true}, {"a", 0, true}, {"a", 0, false},
		}},
		{"refill one per second", 1, 2, []step{
			{"a", 0, true}, {"a", 0, true}, {"a", 0, false},
			{"a", 500 * time.Millisecond, false}, {"a", time.Second, true}, {"a", time.Second, false},
		}},
		{"keys are independent", 1, 1, []step{
			{"a", 0, true}, {"a", 0, false}, {"b", 0, true}, {"b", 0, false},
		}},
		{"refill caps at burst", 10, 2, []step{
			{"a", 0, true}, {"a", time.Hour, true}, {"a", time.Hour, true}, {"a", time.Hour, false},
		}},
		{"clock going backwards refills nothing", 1, 1, []step{
			{"a", 10 * time.Second, true}, {"a", 0, false}, {"a", 10 * time.Second, false}, {"a", 11 * time.Second, true},
		}},
		{"fractional rate", 0.5, 1, []step{
			{"a", 0, true}, {"a", time.Second, false}, {"a", 2 * time.Second, true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rl := NewRateLimiter(tc.rate, tc.burst)
			for i, s := range tc.steps {
				if got := rl.Allow(s.key, t0.Add(s.at)); got != s.want {
					t.Fatalf("step %d (%s at %v): got %v want %v", i, s.key, s.at, got, s.want)
				}
			}
		})
	}
}

// TestRateLimiterEvictsIdle: keys whose buckets refilled are forgotten, so
// memory stays bounded by the keys active recently.
func TestRateLimiterEvictsIdle(t *testing.T) {
	rl := NewRateLimiter(10, 5)
	t0 := time.Unix(0, 0)
	for i := range 10000 {
		// Each key is used once; after a second all buckets are full again.
		rl.Allow(fmt.Sprintf("sb-%d", i), t0.Add(time.Duration(i)*time.Second))
	}
	if n := rl.Len(); n > 200 {
		t.Fatalf("%d keys tracked after 10000 idle ones, want a bounded number", n)
	}
	// An active, drained key survives sweeps with its state.
	now := t0.Add(time.Hour)
	for range 5 {
		rl.Allow("busy", now)
	}
	for i := range 1000 {
		rl.Allow(fmt.Sprintf("new-%d", i), now)
	}
	if rl.Allow("busy", now) {
		t.Fatal("drained key was reset by eviction")
	}
}

func TestRateLimiterConcurrent(t *testing.T) {
	rl := NewRateLimiter(1, 100)
	now := time.Unix(0, 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				ok := rl.Allow("shared", now)
				rl.Allow(fmt.Sprintf("g%d-%d", g, i), now)
				if ok {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if allowed != 100 {
		t.Fatalf("allowed %d of 400 concurrent requests, want exactly the burst of 100", allowed)
	}
}

func TestNewRateLimiterPanics(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
	}{{0, 1}, {-1, 1}, {1, 0}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewRateLimiter(%v, %d) did not panic", tc.rate, tc.burst)
				}
			}()
			NewRateLimiter(tc.rate, tc.burst)
		}()
	}
}
