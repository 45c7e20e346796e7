package pack

import (
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/google"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// DefaultRegistry reaches registries with the standard credentials: the
// Docker config keychain (~/.docker/config.json and its credential
// helpers), then Google's (Application Default Credentials, gcloud) for
// Artifact Registry and gcr.io. insecure allows plain http.
func DefaultRegistry(insecure bool) Registry {
	kc := authn.NewMultiKeychain(authn.DefaultKeychain, google.Keychain)
	return Registry{Options: []remote.Option{remote.WithAuthFromKeychain(kc)}, Insecure: insecure}
}
