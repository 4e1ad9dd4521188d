"""The unit tier of the pure core (`choreography_ray.core`): memory storage, fake hosts, no Ray."""
