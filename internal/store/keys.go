package store

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/corralhq/corral/internal/idgen"
)

// Roles of API keys (the api package's Role values).
const (
	// RoleAdmin may use every route and see every team's records.
	RoleAdmin = "admin"
	// RoleMember acts for its own team only.
	RoleMember = "member"
)

// Key limits and formats (docs/api.md, "Keys").
const (
	// KeyPrefix starts every key corral makes: E2B's format, e2b_ and
	// KeyHexLen lower-case hex digits, which E2B SDKs accept.
	KeyPrefix = "e2b_"
	// KeyHexLen is how many hex digits follow KeyPrefix (160 bits).
	KeyHexLen = 40
	// KeyIDLen is how many hex digits of a key's SHA-256 make its id.
	KeyIDLen = 16
	// MaxKeyNameLen bounds a key's name, in bytes.
	MaxKeyNameLen = 64
	// AllTeams is the ?team= value meaning every team; no team may be
	// named so.
	AllTeams = "all"
)

// teamName is the syntax of a team name: lower-case letters, digits, _
// and -, starting with a letter or digit, 1 to 63 characters.
var teamName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// keyIDSyntax is the syntax of a key id.
var keyIDSyntax = regexp.MustCompile(`^[0-9a-f]{16}$`)

// ErrLastAdminKey: the key is the last unrevoked admin key; revoking it
// would leave the server without an admin.
var ErrLastAdminKey = errors.New("it is the last unrevoked admin key; create another admin key first")

// InvalidKeyError is a key request refused for its fields (a bad team
// name, role or key name); nothing was stored.
type InvalidKeyError struct{ Msg string }

func (e *InvalidKeyError) Error() string { return e.Msg }

// HashKey returns the stored form of an API key (hex SHA-256). The key
// itself is never stored.
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// KeyID is the id of the key whose HashKey is hash: its first KeyIDLen
// hex digits. The id names a key in lists, audit events and revocation;
// it is not a credential (64 bits of a hash reveal nothing usable about
// a 160-bit key).
func KeyID(hash string) string {
	if len(hash) < KeyIDLen {
		return hash
	}
	return hash[:KeyIDLen]
}

// NewKeyValue returns a new random API key: KeyPrefix and KeyHexLen hex
// digits from crypto/rand.
func NewKeyValue() string { return KeyPrefix + idgen.Hex(KeyHexLen/2) }

// ValidTeam checks a team name. It refuses "all" (?team=all means every
// team) and anything outside teamName's syntax, so that a team name is
// safe in URLs, metric labels and log lines.
func ValidTeam(team string) error {
	switch {
	case team == AllTeams:
		return &InvalidKeyError{`team: "all" is reserved (?team=all means every team)`}
	case !teamName.MatchString(team):
		return &InvalidKeyError{fmt.Sprintf("team: %q is not a team name (1 to 63 of a-z, 0-9, _ and -, starting with a letter or digit)", team)}
	}
	return nil
}

// checkKeyFields validates a new key's name, team and role: the one
// check of every key stored.
func checkKeyFields(name, team, role string) error {
	if err := ValidTeam(team); err != nil {
		return err
	}
	if role != RoleAdmin && role != RoleMember {
		return &InvalidKeyError{fmt.Sprintf("role: %q is not a role (admin or member)", role)}
	}
	if len(name) > MaxKeyNameLen {
		return &InvalidKeyError{fmt.Sprintf("name: longer than %d bytes", MaxKeyNameLen)}
	}
	if !utf8.ValidString(name) || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return &InvalidKeyError{"name: must be printable UTF-8 text (no control characters or line breaks)"}
	}
	return nil
}

// APIKey is a stored API key: never the key itself, only its hash.
type APIKey struct {
	// ID is KeyID(Hash): how lists, audit events and revocation name
	// the key.
	ID string
	// Hash is HashKey of the key (hex SHA-256).
	Hash string
	// Name names the key ("admin" for the data dir's admin.key).
	Name string
	// Team is the team the key acts for.
	Team string
	// Role is RoleAdmin or RoleMember.
	Role      string
	CreatedAt time.Time
	// RevokedAt is when the key was revoked; a revoked key authenticates
	// nothing.
	RevokedAt *time.Time
}

const keyCols = `hash, name, team, role, created_at, revoked_at`

func scanKey(sc scanner) (*APIKey, error) {
	var k APIKey
	var created int64
	var revoked sql.NullInt64
	if err := sc.Scan(&k.Hash, &k.Name, &k.Team, &k.Role, &created, &revoked); err != nil {
		return nil, err
	}
	k.ID = KeyID(k.Hash)
	k.CreatedAt = time.UnixMilli(created).UTC()
	if revoked.Valid {
		t := time.UnixMilli(revoked.Int64).UTC()
		k.RevokedAt = &t
	}
	return &k, nil
}

// CreateAPIKey makes a new key of team with role and name and returns
// its value (which is not stored and cannot be shown again) and its
// record. Bad fields give an *InvalidKeyError and store nothing.
func (s *Store) CreateAPIKey(ctx context.Context, name, team, role string) (string, *APIKey, error) {
	if err := checkKeyFields(name, team, role); err != nil {
		return "", nil, err
	}
	for {
		key := NewKeyValue()
		hash := HashKey(key)
		// A new key's id must name one key: a (2^-64) clash with a
		// stored key's id draws another key.
		if _, err := s.GetAPIKey(ctx, KeyID(hash)); err == nil {
			continue
		} else if !errors.Is(err, ErrNotFound) {
			return "", nil, err
		}
		if _, err := s.db.ExecContext(ctx, `INSERT INTO api_keys (hash, name, created_at, team, role) VALUES (?,?,?,?,?)`,
			hash, name, ms(time.Now()), team, role); err != nil {
			return "", nil, fmt.Errorf("create api key: %w", err)
		}
		k, err := s.GetAPIKey(ctx, KeyID(hash))
		if err != nil {
			return "", nil, err
		}
		return key, k, nil
	}
}

// AddAPIKey stores the hash of a given key (the data dir's admin.key,
// test fixtures) as a key of team ("" is DefaultTeam) with role, unless
// a key with that value is stored already: a stored key is left exactly
// as it is — team, role, created_at and revocation. It defends against a
// restart (which adds admin.key again) reviving a revoked admin key.
func (s *Store) AddAPIKey(ctx context.Context, name, key, team, role string) error {
	team = teamOr(team)
	if err := checkKeyFields(name, team, role); err != nil {
		return err
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys (hash, name, created_at, team, role) VALUES (?,?,?,?,?)
		ON CONFLICT(hash) DO NOTHING`, HashKey(key), name, ms(time.Now()), team, role)
	if err != nil {
		return fmt.Errorf("add api key: %w", err)
	}
	return nil
}

// GetAPIKey returns the key whose id is id, revoked or not, or an error
// wrapping ErrNotFound.
func (s *Store) GetAPIKey(ctx context.Context, id string) (*APIKey, error) {
	if !keyIDSyntax.MatchString(id) {
		return nil, fmt.Errorf("api key %q: %w", id, ErrNotFound)
	}
	// Hashes are lower-case hex: every hash starting with id sorts
	// between id and id+"g" (an index range, not a scan).
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE hash >= ? AND hash < ?`, id, id+"g"))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("api key %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get api key %s: %w", id, err)
	}
	return k, nil
}

// ListAPIKeys returns the keys of team ("" = every team), revoked ones
// too, oldest first. The records hold hashes; callers show ids.
func (s *Store) ListAPIKeys(ctx context.Context, team string) ([]*APIKey, error) {
	q, args := `SELECT `+keyCols+` FROM api_keys`, []any{}
	if team != "" {
		q += ` WHERE team=?`
		args = append(args, team)
	}
	q += ` ORDER BY created_at, rowid` // rowid: creation order within a millisecond
	return queryAll(ctx, s.db, "list api keys", q, args, scanKey)
}

// RevokeAPIKey revokes the key whose id is id at at and returns its
// record, and whether this call revoked it. Revoking a revoked key
// changes nothing (its first revocation time stays). An unknown id gives
// an error wrapping ErrNotFound; the last unrevoked admin key gives
// ErrLastAdminKey and stays valid, so the server always keeps an admin
// (the check and the revocation are one statement in a serializable
// transaction: two concurrent revocations — also by two control planes
// sharing a PostgreSQL store — cannot both pass it).
func (s *Store) RevokeAPIKey(ctx context.Context, id string, at time.Time) (*APIKey, bool, error) {
	k, err := s.GetAPIKey(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if k.RevokedAt != nil {
		return k, false, nil
	}
	var n int64
	err = s.db.inTx(ctx, true, func(tx *tx) error {
		r, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at=? WHERE hash=? AND revoked_at IS NULL
			AND (role<>? OR (SELECT count(*) FROM api_keys WHERE role=? AND revoked_at IS NULL) > 1)`,
			ms(at), k.Hash, RoleAdmin, RoleAdmin)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("revoke api key %s: %w", id, err)
	}
	if k, err = s.GetAPIKey(ctx, id); err != nil {
		return nil, false, err
	}
	if n == 0 && k.RevokedAt == nil {
		return nil, false, ErrLastAdminKey
	}
	return k, n == 1, nil
}

// LookupAPIKey returns the stored, unrevoked key whose hash is
// HashKey(key), or an error wrapping ErrNotFound. It reads the store on
// every call (nothing is cached), so a revocation takes effect on the
// key's next request. The row is found by the key's SHA-256 (an index
// lookup whose timing can reveal at most a prefix of a hash, not of the
// key), then the stored hash is compared with the computed one in
// constant time, so a timing side channel tells a caller nothing about a
// key it does not hold.
func (s *Store) LookupAPIKey(ctx context.Context, key string) (*APIKey, error) {
	want := HashKey(key)
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE hash=?`, want))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("api key: %w", ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(k.Hash), []byte(want)) != 1 || k.RevokedAt != nil {
		return nil, fmt.Errorf("api key: %w", ErrNotFound)
	}
	return k, nil
}
