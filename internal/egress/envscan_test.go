package egress

import "testing"

func TestScanEnv(t *testing.T) {
	tests := []struct {
		name, key, value string
		flagged          bool
	}{
		{"github token by shape", "X", "ghp_" + "abcdefghijklmnopqrstuvwxyz0123456789", true},
		{"openai key by shape", "CONFIG", "sk-proj-abcdefghijklmnopqrstuvwxyz012345", true},
		{"aws key id", "AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE", true},
		{"random token", "SOMETHING", "q8Zr2LmX0vT9bKpW4sYc7NdH1jFgA6eUo3iRt5yE", true},
		{"name suggests", "DB_PASSWORD", "hunter2hunter2", true},
		{"api key name", "MY_API_KEY", "abc123def456", true},
		{"jwt", "SESSION", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", true},
		{"plain value", "HOME_DIR", "/home/user", false},
		{"boolean", "USE_TOKEN", "true", false},
		{"short value", "TOKEN", "abc", false},
		{"url", "API_KEY_URL", "https://example.com/keys", false},
		{"ordinary", "LANG", "C.UTF-8", false},
		{"placeholder", "GITHUB_TOKEN", "CORRAL_SECRET_github", false},
		{"sentence", "GREETING", "hello world this is a long sentence of words", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ScanEnv(map[string]string{tc.key: tc.value})
			if (len(got) == 1) != tc.flagged {
				t.Fatalf("ScanEnv(%s=...) = %v, flagged want %v", tc.key, got, tc.flagged)
			}
			for _, f := range got {
				if f.Name != tc.key || f.Why == "" {
					t.Fatalf("finding %+v", f)
				}
			}
		})
	}
}
