package integration

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
	corral "github.com/corralhq/corral/sdk/go"
)

// teamClients makes two member keys of two new teams on st and returns
// a client of each (the server at url).
func teamClients(t *testing.T, st *store.Store, url string) (a, b *corral.Client, teamA, teamB string) {
	t.Helper()
	teamA, teamB = "team-a-"+randHex(3), "team-b-"+randHex(3)
	keyA, keyB := "e2b_"+randHex(20), "e2b_"+randHex(20)
	for _, k := range []struct{ key, team string }{{keyA, teamA}, {keyB, teamB}} {
		if err := st.AddAPIKey(context.Background(), k.team, k.key, k.team, "member"); err != nil {
			t.Fatal(err)
		}
	}
	return corral.New(url, keyA), corral.New(url, keyB), teamA, teamB
}

// sameRefusal fails the test unless err (naming ref) is a 400
// invalid_argument whose message is missing's (naming missRef) with the
// name swapped: another team's object is refused exactly as a missing one.
func sameRefusal(t *testing.T, what string, err error, ref string, missing error, missRef string) {
	t.Helper()
	var got, want *corral.APIError
	if !errors.As(err, &got) || !errors.As(missing, &want) {
		t.Fatalf("%s: %v (missing: %v), want API errors", what, err, missing)
	}
	if got.Status != http.StatusBadRequest || got.Code != corral.CodeInvalidArgument || got.Status != want.Status || got.Code != want.Code ||
		strings.ReplaceAll(got.Message, ref, missRef) != want.Message {
		t.Fatalf("%s: %d %s %q; a missing one: %d %s %q; want the same 400", what, got.Status, got.Code, got.Message, want.Status, want.Code, want.Message)
	}
}

// testNetSecretTeams: brokered secrets belong to a team. Team B's create
// naming team A's secret is refused exactly as a secret that does not
// exist (so the egress proxy can never inject A's credential into B's
// sandbox, and B learns nothing of A's names); once B registers its own
// secret of the same name, B's sandbox gets B's value and A's sandbox
// A's, each at the real upstream over intercepted TLS, and the upstream
// never sees A's value from B's sandbox.
func testNetSecretTeams(t *testing.T, fx *netFixture) {
	s := fx.srv
	ctx := context.Background()
	ca, cb, _, _ := teamClients(t, s.ts.Srv.Store, s.ts.URL)
	const sec = "teamgh"
	valueA, valueB := "Bearer "+randAlnum(t, 40), "Bearer "+randAlnum(t, 40)
	if _, err := ca.PutSecret(ctx, sec, []string{hostSecret}, "Authorization", valueA); err != nil {
		t.Fatalf("team A puts its secret: %v", err)
	}
	opts := func(secret string) corral.CreateOptions {
		return corral.CreateOptions{Network: "allow", Allow: []string{hostSecret}, Secrets: []string{secret}, Timeout: 10 * time.Minute}
	}
	_, errA := cb.Create(ctx, opts(sec))
	_, errMissing := cb.Create(ctx, opts("nosuchsecret"))
	sameRefusal(t, "team B's create naming team A's secret", errA, sec, errMissing, "nosuchsecret")

	if _, err := cb.PutSecret(ctx, sec, []string{hostSecret}, "Authorization", valueB); err != nil {
		t.Fatalf("team B puts its own secret named like team A's: %v", err)
	}
	for _, tc := range []struct {
		team        string
		c           *corral.Client
		want, never string
	}{{"A", ca, valueA, valueB}, {"B", cb, valueB, valueA}} {
		sb, err := tc.c.Create(ctx, opts(sec))
		if err != nil {
			t.Fatalf("team %s's sandbox with its secret: %v", tc.team, err)
		}
		t.Cleanup(func() { _, _ = tc.c.Kill(context.Background(), sb.ID) })
		path := "/teams/secret-" + tc.team + "-" + randHex(3)
		r := curl(t, sb, `-H "Authorization: $CORRAL_SECRET_`+sec+`" https://`+hostSecret+path)
		var rep echoReply
		if r.Exit != 0 || r.Code != http.StatusOK || json.Unmarshal([]byte(r.Body), &rep) != nil {
			t.Fatalf("team %s's curl: exit %d status %d body %q stderr %q", tc.team, r.Exit, r.Code, r.Body, r.Stderr)
		}
		got := fx.up.requests(path)
		if len(got) != 1 || got[0].Auth != tc.want || rep.AuthSHA256 != sha256Hex(tc.want) {
			t.Fatalf("team %s's request reached the upstream %d times, with its own value: %v, with the other team's: %v",
				tc.team, len(got), len(got) == 1 && got[0].Auth == tc.want, len(got) == 1 && got[0].Auth == tc.never)
		}
	}
	for _, c := range []*corral.Client{ca, cb} {
		_ = c.DeleteSecret(context.Background(), sec)
	}
}

// TestVolumeTeams: volumes belong to a team. Team B's create mounting
// team A's volume (by name or id) is refused exactly as a volume that
// does not exist, so B never mounts A's data; team B may create its own
// volume of the same name, and each team's sandbox then sees its own
// files only. A volume's content-API token reaches that volume only:
// A's token on B's volume is refused and B's file is not read.
func TestVolumeTeams(t *testing.T) {
	need(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("volumes need loop devices: " + err.Error())
	}
	ctx := context.Background()
	ca, cb, _, _ := teamClients(t, env.srv.Store, env.url)
	vname := "teamvol-" + randHex(3)
	va, err := ca.CreateVolume(ctx, vname, 16)
	if err != nil {
		t.Fatalf("team A creates a volume: %v", err)
	}
	t.Cleanup(func() { _ = ca.DeleteVolume(context.Background(), va.ID) })

	for _, ref := range []string{vname, va.ID} {
		mount := func(v string) corral.CreateOptions {
			return corral.CreateOptions{Volumes: []corral.VolumeMount{{Volume: v, Path: "/data"}}}
		}
		_, errA := cb.Create(ctx, mount(ref))
		_, errMissing := cb.Create(ctx, mount("nosuchvolume"))
		sameRefusal(t, "team B's create mounting team A's volume "+ref, errA, ref, errMissing, "nosuchvolume")
		if _, err := cb.Volume(ctx, ref); !errors.Is(err, corral.ErrNotFound) {
			t.Fatalf("team B gets team A's volume %s: %v, want not_found", ref, err)
		}
	}

	vb, err := cb.CreateVolume(ctx, vname, 16)
	if err != nil {
		t.Fatalf("team B creates its own volume named like team A's: %v", err)
	}
	t.Cleanup(func() { _ = cb.DeleteVolume(context.Background(), vb.ID) })
	for _, tc := range []struct {
		team string
		c    *corral.Client
	}{{"A", ca}, {"B", cb}} {
		sb, err := tc.c.Create(ctx, corral.CreateOptions{Volumes: []corral.VolumeMount{{Volume: vname, Path: "/data"}}})
		if err != nil {
			t.Fatalf("team %s mounts its own %s: %v", tc.team, vname, err)
		}
		// A writes first; B's volume of the same name must not show it.
		res, err := sb.Run(ctx, "cat /data/owner 2>/dev/null || echo none; echo "+tc.team+" > /data/owner", corral.RunOptions{Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "none" {
			t.Fatalf("team %s's own volume %s before it wrote: %+v %v; want no owner file (another team's data)", tc.team, vname, res, err)
		}
		if _, err := tc.c.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}

	// The content API: each volume's own token reads its own file; A's
	// token on B's volume is refused.
	read := func(id, token string) (int, string) {
		req, _ := http.NewRequest("GET", env.url+"/volumecontent/"+id+"/file?path=/owner", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, body := read(va.ID, va.Token); st != http.StatusOK || strings.TrimSpace(body) != "A" {
		t.Fatalf("team A reads its volume with its token: %d %q", st, body)
	}
	if st, body := read(vb.ID, vb.Token); st != http.StatusOK || strings.TrimSpace(body) != "B" {
		t.Fatalf("team B reads its volume with its token: %d %q", st, body)
	}
	if st, body := read(vb.ID, va.Token); st != http.StatusUnauthorized || strings.Contains(body, "B") {
		t.Fatalf("team A's token on team B's volume: %d %q, want 401 and nothing of B's", st, body)
	}
}
