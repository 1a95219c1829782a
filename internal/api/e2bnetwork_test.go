package api

import (
	"slices"
	"testing"
)

func TestE2BPolicy(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name     string
		internet *bool
		network  string
		defMode  string
		mode     string
		allow    []string
		wantErr  bool
	}{
		{"nothing asked, default none", nil, "", "", "none", nil, false},
		{"internet true, default none", &yes, "", "none", "none", nil, false},
		{"internet true, operator chose all-public", &yes, "", "all-public", "all-public", nil, false},
		{"internet false", &no, "", "all-public", "none", nil, false},
		{"allowOut", nil, `{"allowOut":["api.github.com","1.1.1.1"],"denyOut":["0.0.0.0/0"]}`, "", "allow", []string{"api.github.com", "1.1.1.1"}, false},
		{"allowOut beats internet false", &no, `{"allowOut":["*.pypi.org"]}`, "", "allow", []string{"*.pypi.org"}, false},
		{"deny all", nil, `{"denyOut":["0.0.0.0/0"]}`, "all-public", "none", nil, false},
		{"update body carries internet flag", nil, `{"allow_internet_access":false}`, "all-public", "none", nil, false},
		{"specific deny refused", nil, `{"denyOut":["8.8.8.8"]}`, "", "", nil, true},
		{"rules refused", nil, `{"rules":{"api.x.com":[{"transform":{"headers":{"a":"b"}}}]}}`, "", "", nil, true},
		{"egress proxy refused", nil, `{"egressProxy":{"address":"1.2.3.4:1080"}}`, "", "", nil, true},
		{"empty rules accepted", nil, `{"rules":{}}`, "", "none", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var nc *e2bNetworkConfig
			if tc.network != "" {
				if err := parseJSON([]byte(tc.network), &nc, false); err != nil {
					t.Fatal(err)
				}
			}
			mode, allow, err := e2bPolicy(tc.internet, nc, tc.defMode)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if mode != tc.mode || !slices.Equal(allow, tc.allow) {
				t.Fatalf("got %s %v, want %s %v", mode, allow, tc.mode, tc.allow)
			}
		})
	}
}
