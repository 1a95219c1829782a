package egress

import (
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
)

// TestExfilSuspectOrdinary: names package managers, clouds and APIs really
// use must pass the DNS-exfiltration heuristics (threat-model.md #8).
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
// exfiltration and tunnels are flagged (threat-model.md #8).
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
