// SPDX-License-Identifier: Apache-2.0

package archive

import "fmt"

func fetchS3(url string, sel Selection) ([]Entry, string, error) {
	return nil, "", fmt.Errorf("%s: s3 archives are not supported yet", url)
}

func listS3(url string) ([]Entry, error) {
	return nil, fmt.Errorf("%s: s3 archives are not supported yet", url)
}
